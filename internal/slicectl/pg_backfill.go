package slicectl

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/source/postgres"
)

func newPGBackfillCommand(o *pgOptions) *cobra.Command {
	var batch int
	cmd := &cobra.Command{
		Use:   "backfill",
		Short: "Fill the placement column of the rows that have none",
		Long: `backfill computes each key's placement (xxhash64 with its top bit flipped) for the
rows of the table whose placement column is NULL, --batch rows per transaction,
until none is left: for an existing table that just got the column. Rows written
meanwhile by the writer library come with it filled. Scans cannot find a row
without one: backfill before the distributors start.`,
		Example: `  slicectl pg backfill --pg-dsn postgres://app@db/app --pg-table users --pg-key-column name --pg-value-column profile --pg-fragment-column ''`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return usageError(err)
			}
			if batch < 1 {
				return usageError(fmt.Errorf("--batch %d: want at least 1", batch))
			}
			return o.withSource(cmd, func(ctx context.Context, s *postgres.Source) error {
				n, err := s.Backfill(ctx, batch)
				fmt.Fprintf(cmd.OutOrStdout(), "filled %d rows\n", n)
				return err
			})
		},
	}
	cmd.Flags().IntVar(&batch, "batch", 1000, "rows per transaction")
	return cmd
}
