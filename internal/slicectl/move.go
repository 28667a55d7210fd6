package slicectl

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

func newMoveCommand(g *globalOptions) *cobra.Command {
	var to []string
	cmd := &cobra.Command{
		Use:   "move SLICE --to NODE[,NODE...]",
		Short: "Give a slice a new replica set",
		Long: `move gives the slice SLICE the replica set --to: one node, or several to
replicate it. The nodes must be registered and not draining. Moving a slice to
the nodes that hold it already changes nothing. Balancing passes remember the
move as one of their own, so that the next pass does not undo it at once; pin
the slice to keep it there for good.

SLICE is the slice's start (0x4000000000000000 or decimal), key:TEXT for the
slice holding a key, or hash:POINT for the slice holding a point.`,
		Example: `  slicectl move 0x4000000000000000 --to n2
  slicectl move key:user:42 --to n2,n3
  slicectl move hash:0x8000000000000001 --to n1 -o json`,
		Args: sliceArgs("SLICE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(to) == 0 {
				return usageError(fmt.Errorf("missing --to: give the node or nodes to hold the slice (usage: %s)", cmd.UseLine()))
			}
			for _, id := range to {
				if strings.TrimSpace(id) == "" {
					return usageError(fmt.Errorf("--to %q: a node ID is empty", strings.Join(to, ",")))
				}
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Move(ctx, &pb.MoveRequest{Slice: mustSliceRef(args[0]), To: to})
				if err != nil {
					return err
				}
				return printChange(s, resp.GetChange())
			})
		},
	}
	cmd.Flags().StringSliceVar(&to, "to", nil, "the nodes to hold the slice, comma-separated (or repeated)")
	_ = cmd.RegisterFlagCompletionFunc("to", g.completeNodes)
	return cmd
}
