package slicectl

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// jsonPin is what pin and unpin changed.
type jsonPin struct {
	Summary string    `json:"summary"`
	Range   jsonRange `json:"range"`
	Pinned  bool      `json:"pinned"`
	// Changed is false when the slice already was as asked (pinned, or not pinned): pin and
	// unpin are both idempotent.
	Changed bool `json:"changed"`
}

func newPinCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "pin SLICE",
		Short: "Keep a slice where it is: balancing passes leave it alone",
		Long: `pin keeps the range of the slice SLICE where it is: balancing passes never move,
split or merge it, and its replica set stays as it is. Overrides (move, split,
merge) still apply to it. status lists the pinned ranges; unpin releases one.
Pinning a pinned slice succeeds, says so, and changes nothing.`,
		Example: `  slicectl pin 0x4000000000000000
  slicectl pin key:user:42`,
		Args: sliceArgs("SLICE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Pin(ctx, &pb.PinRequest{Slice: mustSliceRef(args[0])})
				if err != nil {
					return err
				}
				r := resp.GetPinned()
				out := jsonPin{Summary: "pin " + showRange(r), Range: rangeJSON(r), Pinned: true, Changed: !resp.GetAlready()}
				line := fmt.Sprintf("pinned %s: balancing passes leave it where it is", showRange(r))
				if resp.GetAlready() {
					out.Summary = showRange(r) + " is already pinned"
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
