package slicectl

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/source/postgres"
)

func newPGInitCommand(o *pgOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "init",
		Short: "Create the items table, its placement index and the publication",
		Long: `init creates the table of --pg-table if it does not exist, with the column names
given (key bytea, fragment text, value bytea, the placement column bigint), its
primary key (key, fragment) and the index on the placement column, and the
publication of --pg-publication. An existing table is left as it is (see backfill).`,
		Example: `  slicectl pg init --pg-dsn postgres://app@127.0.0.1/app
  slicectl pg init --pg-dsn 'host=db sslmode=verify-full sslrootcert=ca.crt' --pg-table shard.items`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return usageError(err)
			}
			ctx, cancel := o.context(cmd)
			defer cancel()
			if err := postgres.Init(ctx, o.cfg); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "table %s and publication %s ready\n", o.cfg.Table, o.cfg.Publication)
			return nil
		},
	}
}
