package slicectl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// jsonQuarantine is a range in quarantine, as status and explain show it.
type jsonQuarantine struct {
	Range jsonRange  `json:"range"`
	Since *time.Time `json:"since"`
	// Nodes crashed shortly after acquiring it, in that order.
	Nodes []string `json:"nodes"`
}

func quarantinesJSON(qs []*pb.Quarantine) []jsonQuarantine {
	out := []jsonQuarantine{}
	for _, q := range qs {
		nodes := q.GetNodes()
		if nodes == nil {
			nodes = []string{}
		}
		out = append(out, jsonQuarantine{Range: rangeJSON(q.GetRange()), Since: jsonTime(q.GetSince()), Nodes: nodes})
	}
	return out
}

// printQuarantined writes a row per quarantined range, or one saying there is none.
func printQuarantined(w io.Writer, qs []*pb.Quarantine) {
	if len(qs) == 0 {
		row(w, "quarantined", "none")
	}
	for i, q := range qs {
		label := ""
		if i == 0 {
			label = "quarantined"
		}
		row(w, label, fmt.Sprintf("%s since %s: nodes %s crashed after acquiring it; held by no node (slicectl unquarantine lifts it)",
			showRange(q.GetRange()), showTime(q.GetSince(), time.Now()), strings.Join(q.GetNodes(), ",")))
	}
}

// jsonUnquarantine is what unquarantine changed.
type jsonUnquarantine struct {
	Summary string    `json:"summary"`
	Range   jsonRange `json:"range"`
	// Changed is false when no quarantine overlapped the slice: nothing changed.
	Changed bool `json:"changed"`
}

func newUnquarantineCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "unquarantine SLICE",
		Short: "Lift the quarantine of a key of death: let passes place its range again",
		Long: `unquarantine lifts the quarantines that overlap the slice SLICE. The assigner
quarantines a range when nodes crash twice (their leases lapse without a drain)
shortly after acquiring it, within --quarantine-window: it takes the range off
every node, so that the key that crashes its holders stops walking round the
cluster, and routers answer its keys as unavailable. status and explain list
the quarantined ranges. Lift one once the cause is fixed (or to try again): the
next balancing pass places the range on a node, and the crashes seen on it are
forgotten, so that two more crashes quarantine it again. Like unpin, it is
idempotent: lifting what is not quarantined succeeds, says so, and changes
nothing. Every quarantine and lift is in the audit trail.`,
		Example: `  slicectl unquarantine key:user:42
  slicectl unquarantine 0x4000000000000000`,
		Args: sliceArgs("SLICE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Unquarantine(ctx, &pb.UnquarantineRequest{Slice: mustSliceRef(args[0])})
				if err != nil {
					return err
				}
				r := resp.GetLifted()
				out := jsonUnquarantine{Summary: "lift the quarantine of " + showRange(r), Range: rangeJSON(r), Changed: !resp.GetAlready()}
				line := fmt.Sprintf("lifted the quarantine overlapping %s: the next pass places it on a node", showRange(r))
				if resp.GetAlready() {
					out.Summary = showRange(r) + " is not quarantined"
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
