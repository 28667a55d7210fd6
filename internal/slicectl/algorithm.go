package slicectl

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/balance"
)

func newAlgorithmCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "algorithm",
		Short: "Show or choose the balancing algorithm and its constants",
		Long: `algorithm shows the balancing algorithm the assigner runs, with its constants,
or chooses another one or other constants. The choice is stored with the map
and survives a failover.

Algorithms: ` + strings.Join(balance.Names(), ", ") + `.
slicectl sim --help lists every algorithm's constants with their defaults; sim
compares algorithms and constants offline before you set them here.`,
		Example: `  slicectl algorithm show
  slicectl algorithm set weighted-move --param max_churn=0.05 --param dead_band=0.05
  slicectl algorithm set consistent-hash`,
		Args: cobra.ArbitraryArgs,
		RunE: helpOrUnknown,
	}
	cmd.AddCommand(newAlgorithmShowCommand(g), newAlgorithmSetCommand(g))
	return cmd
}
