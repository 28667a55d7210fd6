package slicectl

import (
	"context"

	"github.com/spf13/cobra"
)

func newUnfreezeCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "unfreeze",
		Short: "Resume balancing passes",
		Long:  `unfreeze resumes the balancing passes that freeze stopped.`,
		Example: `  slicectl unfreeze
  slicectl unfreeze -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				return setFrozen(ctx, s, false, "")
			})
		},
	}
}
