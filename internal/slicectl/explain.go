package slicectl

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

type jsonCandidate struct {
	Action string    `json:"action"`
	Slice  jsonRange `json:"slice"`
	From   string    `json:"from"`
	To     []string  `json:"to"`
	Gain   jsonFloat `json:"gain"`
	Cost   jsonFloat `json:"cost"`
	Chosen bool      `json:"chosen"`
	Reason string    `json:"reason"`
}

type jsonChurn struct {
	Cleanup jsonFloat `json:"cleanup"`
	Merge   jsonFloat `json:"merge"`
	Move    jsonFloat `json:"move"`
}

type jsonExplain struct {
	// Passed is false when no pass has run yet in this term; the rest is then empty.
	Passed          bool            `json:"passed"`
	Frozen          bool            `json:"frozen"`
	Position        jsonPosition    `json:"position"`
	Algorithm       string          `json:"algorithm"`
	ImbalanceBefore jsonFloat       `json:"imbalance_before"`
	ImbalanceAfter  jsonFloat       `json:"imbalance_after"`
	ChurnBudget     jsonFloat       `json:"churn_budget"`
	Churn           jsonChurn       `json:"churn"`
	Splits          uint32          `json:"splits"`
	Merges          uint32          `json:"merges"`
	Moves           uint32          `json:"moves"`
	ReplicasAdded   uint32          `json:"replicas_added"`
	ReplicasRemoved uint32          `json:"replicas_removed"`
	Reassigned      uint32          `json:"reassigned"`
	Stop            string          `json:"stop"`
	Candidates      []jsonCandidate `json:"candidates"`
	// Quarantined ranges are held by no node: no pass places them.
	Quarantined []jsonQuarantine `json:"quarantined"`
	jsonPassFailures
}

func explainJSON(x *pb.ExplainResponse, frozen bool) jsonExplain {
	out := jsonExplain{
		Passed: x.GetPassed(), Frozen: frozen, Position: positionJSON(x.GetPosition()), Algorithm: x.GetAlgorithm(),
		ImbalanceBefore: jsonFloat(x.GetImbalanceBefore()), ImbalanceAfter: jsonFloat(x.GetImbalanceAfter()), ChurnBudget: jsonFloat(x.GetChurnBudget()),
		Churn:  jsonChurn{Cleanup: jsonFloat(x.GetChurnCleanup()), Merge: jsonFloat(x.GetChurnMerge()), Move: jsonFloat(x.GetChurnMove())},
		Splits: x.GetSplits(), Merges: x.GetMerges(), Moves: x.GetMoves(), ReplicasAdded: x.GetReplicasAdded(),
		ReplicasRemoved: x.GetReplicasRemoved(), Reassigned: x.GetReassigned(), Stop: x.GetStop(),
		Candidates: []jsonCandidate{}, Quarantined: quarantinesJSON(x.GetQuarantined()),
		jsonPassFailures: jsonPassFailures{PassFailures: x.GetPassFailures(), PassError: x.GetPassError(),
			PassErrorTime: jsonTime(x.GetPassErrorTime())},
	}
	for _, c := range x.GetCandidates() {
		to := c.GetTo()
		if to == nil {
			to = []string{}
		}
		out.Candidates = append(out.Candidates, jsonCandidate{Action: c.GetAction(), Slice: rangeJSON(c.GetSlice()),
			From: c.GetFrom(), To: to, Gain: jsonFloat(c.GetGain()), Cost: jsonFloat(c.GetCost()), Chosen: c.GetChosen(), Reason: c.GetReason()})
	}
	return out
}

func newExplainCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "explain",
		Short: "Say why the last balancing pass moved what it moved, or nothing",
		Long: `explain answers "why did nothing move?" (or why something did) for the last
balancing pass of the leader's term: the imbalance before the pass and the one
it predicted after it, the churn budget (the share of keys a pass may copy) and
the churn each step spent (clean-up, merge, move), what it did (splits, merges,
moves, replicas added and removed, slices reassigned off departed nodes), why
its move step stopped, and the candidate moves it weighed: the ones it chose,
then the best ones it rejected, each with the imbalance it would have gained,
the share of keys it would have copied, and the reason it was not taken.

It also says when balancing is frozen, as then no pass runs at all, when
passes are failing (how many in a row, and why the last one failed; what follows
is then the last pass that succeeded), and which ranges are in quarantine: held
by no node, which no pass places, because nodes crashed twice shortly after
acquiring them (slicectl unquarantine lifts one).`,
		Example: `  slicectl explain
  slicectl explain -o json | jq '.candidates[] | select(.chosen | not) | .reason'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				st, err := s.admin.Status(ctx, &pb.StatusRequest{})
				if err != nil {
					return err
				}
				x, err := s.admin.Explain(ctx, &pb.ExplainRequest{})
				if err != nil {
					return err
				}
				if !s.out.table() {
					return s.out.print(explainJSON(x, st.GetFrozen()))
				}
				return printExplain(s, x, st)
			})
		},
	}
}

func printExplain(s *session, x *pb.ExplainResponse, st *pb.StatusResponse) error {
	out := s.out.w
	if st.GetFrozen() {
		fmt.Fprintln(out, "balancing is frozen: no pass runs until slicectl unfreeze; the last pass before the freeze follows.")
	}
	if f := showPassFailures(x.GetPassFailures(), x.GetPassError(), x.GetPassErrorTime()); f != "" {
		fmt.Fprintf(out, "balancing passes are %s; the last pass that succeeded follows.\n", f)
	}
	if qs := x.GetQuarantined(); len(qs) > 0 {
		w := newTable(out)
		printQuarantined(w, qs)
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(out, "no pass places the quarantined ranges on a node.")
	}
	if !x.GetPassed() {
		_, err := fmt.Fprintf(out, "no balancing pass has run yet in term %d (map at %s)\n",
			x.GetPosition().GetTerm(), showPosition(x.GetPosition()))
		return err
	}
	w := newTable(out)
	row(w, "map", fmt.Sprintf("position %s", showPosition(x.GetPosition())))
	row(w, "algorithm", x.GetAlgorithm())
	row(w, "imbalance", fmt.Sprintf("%s before, %s predicted after", num(x.GetImbalanceBefore()), num(x.GetImbalanceAfter())))
	budget := "no budget"
	if x.GetChurnBudget() > 0 {
		budget = "budget " + pct(x.GetChurnBudget())
	}
	row(w, "churn", fmt.Sprintf("%s of keys (clean-up %s, merge %s, move %s; %s)",
		pct(x.GetChurnCleanup()+x.GetChurnMerge()+x.GetChurnMove()), pct(x.GetChurnCleanup()),
		pct(x.GetChurnMerge()), pct(x.GetChurnMove()), budget))
	row(w, "did", fmt.Sprintf("%d splits, %d merges, %d moves, %d replicas added, %d removed, %d reassigned",
		x.GetSplits(), x.GetMerges(), x.GetMoves(), x.GetReplicasAdded(), x.GetReplicasRemoved(), x.GetReassigned()))
	stop := x.GetStop()
	if stop == "" {
		stop = "-"
	}
	row(w, "stopped", stop)
	if err := w.Flush(); err != nil {
		return err
	}
	if len(x.GetCandidates()) == 0 {
		_, err := fmt.Fprintln(out, "\nno candidate move was weighed")
		return err
	}
	fmt.Fprintln(out, "\ncandidates:")
	w = newTable(out)
	row(w, "ACTION", "SLICE", "FROM", "TO", "GAIN", "COST", "CHOSEN", "REASON")
	for _, c := range x.GetCandidates() {
		from := c.GetFrom()
		if from == "" {
			from = "-"
		}
		reason := c.GetReason()
		if reason == "" {
			reason = "-"
		}
		row(w, c.GetAction(), showRange(c.GetSlice()), from, showNodes(c.GetTo()), num(c.GetGain()), pct(c.GetCost()),
			yesNo(c.GetChosen()), reason)
	}
	return w.Flush()
}

// pct writes a share as a percentage.
func pct(f float64) string { return num(f*100) + "%" }
