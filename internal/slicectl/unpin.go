package slicectl

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

func newUnpinCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "unpin SLICE",
		Short: "Let balancing passes move a pinned slice again",
		Long: `unpin removes the pins that overlap the slice SLICE, so that balancing passes
may move, split and merge it again. Like pin, it is idempotent: unpinning a
slice that is not pinned succeeds, says so, and changes nothing.`,
		Example: `  slicectl unpin 0x4000000000000000
  slicectl unpin key:user:42`,
		Args: sliceArgs("SLICE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Unpin(ctx, &pb.UnpinRequest{Slice: mustSliceRef(args[0])})
				if err != nil {
					return err
				}
				r := resp.GetUnpinned()
				out := jsonPin{Summary: "unpin " + showRange(r), Range: rangeJSON(r), Pinned: false, Changed: !resp.GetAlready()}
				line := fmt.Sprintf("unpinned %s: balancing passes may move it again", showRange(r))
				if resp.GetAlready() {
					out.Summary = showRange(r) + " is not pinned"
					line = out.Summary + ": nothing changed"
				}
				if !s.out.table() {
					return s.out.print(out)
				}
				_, err = fmt.Fprintln(s.out.w, line)
				return err
			})
		},
	}
}
