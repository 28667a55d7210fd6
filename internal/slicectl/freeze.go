package slicectl

import (
	"context"

	"github.com/spf13/cobra"
)

func newFreezeCommand(g *globalOptions) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "freeze [--reason TEXT]",
		Short: "Stop balancing passes",
		Long: `freeze stops balancing passes: the map stays as it is, apart from overrides,
clock quanta and the first map, which go on. A drain makes no progress while
balancing is frozen, as passes move the slices off a draining node. The reason
goes into the assigner's log. unfreeze resumes balancing.`,
		Example: `  slicectl freeze --reason "incident 4711: investigating hot shard"
  slicectl unfreeze`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				return setFrozen(ctx, s, true, reason)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why balancing is frozen, for the assigner's log")
	return cmd
}
