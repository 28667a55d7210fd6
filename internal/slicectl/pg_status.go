package slicectl

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/jackc/pglogrepl"
	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/source/postgres"
)

func newPGStatusCommand(o *pgOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the table's rows and the distributors' replication slots",
		Long: `status counts the table's rows and those without a placement value (which no scan
finds), says whether the publication exists, and lists the replication slots of
the distributors (named sliceplane_<id>): whether one reads it now, how far it
confirmed, and how much WAL the server keeps for it. A slot of a distributor that
is gone for good keeps WAL forever: drop it with
  SELECT pg_drop_replication_slot('sliceplane_<id>').`,
		Example: `  slicectl pg status --pg-dsn postgres://app@db/app
  slicectl pg status --pg-dsn postgres://app@db/app -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return usageError(err)
			}
			return o.withSource(cmd, func(ctx context.Context, s *postgres.Source) error {
				st, err := s.Status(ctx)
				if err != nil {
					return err
				}
				return printPGStatus(cmd, o.output, st)
			})
		},
	}
}

func printPGStatus(cmd *cobra.Command, format string, st postgres.Status) error {
	p := newPrinter(cmd.OutOrStdout(), format)
	if !p.table() {
		return p.print(st)
	}
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "table\t%s\t%d rows, %d without a placement value\n", st.Table, st.Rows, st.Unplaced)
	fmt.Fprintf(w, "publication\t%v\n", st.Publication)
	fmt.Fprintf(w, "clock\t%s\n", pglogrepl.LSN(st.Clock))
	fmt.Fprintf(w, "\nSLOT\tACTIVE\tCONFIRMED\tWAL KEPT\tWAL STATUS\n")
	for _, sl := range st.Slots {
		fmt.Fprintf(w, "%s\t%v\t%s\t%d bytes\t%s\n", sl.Name, sl.Active, pglogrepl.LSN(sl.Confirmed), sl.Behind, sl.WALStatus)
	}
	return w.Flush()
}
