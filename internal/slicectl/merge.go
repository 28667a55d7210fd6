package slicectl

import (
	"context"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

func newMergeCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "merge LEFT RIGHT",
		Short: "Join two adjacent slices",
		Long: `merge joins the slice LEFT with the slice RIGHT that follows it into one slice,
held by LEFT's replica set (RIGHT's keys move to it first if their replica sets
differ). Both are SLICE arguments: a start, key:TEXT or hash:POINT. The slices
must be adjacent, LEFT first.`,
		Example: `  slicectl merge 0x4000000000000000 0x4100000000000000
  slicectl merge key:user:1 key:user:2`,
		Args: sliceArgs("LEFT", "RIGHT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Merge(ctx, &pb.MergeRequest{Left: mustSliceRef(args[0]), Right: mustSliceRef(args[1])})
				if err != nil {
					return err
				}
				return printChange(s, resp.GetChange())
			})
		},
	}
}
