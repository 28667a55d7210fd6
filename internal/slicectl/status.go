package slicectl

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

type jsonStatus struct {
	Target        string            `json:"target"`
	Leader        bool              `json:"leader"`
	LeaderAddress string            `json:"leader_address"`
	Position      jsonPosition      `json:"position"`
	Clock         uint64            `json:"clock"`
	Generation    uint64            `json:"generation"`
	Imbalance     jsonFloat         `json:"imbalance"`
	Slices        uint32            `json:"slices"`
	Nodes         uint32            `json:"nodes"`
	Frozen        bool              `json:"frozen"`
	Algorithm     string            `json:"algorithm"`
	Params        map[string]string `json:"params"`
	LastPass      *time.Time        `json:"last_pass"`
	Pinned        []jsonRange       `json:"pinned"`
	Handoffs      uint32            `json:"handoffs"`
	Roles         string            `json:"roles"`
	Exclusive     bool              `json:"exclusive"`
	NodeTTL       string            `json:"node_ttl"`
	MinReplicas   uint32            `json:"min_replicas"`
	Quarantined   []jsonQuarantine  `json:"quarantined"`
	jsonPassFailures
	// Source is set while the leader cannot follow its data source.
	Source *jsonSourceLost `json:"source_lost,omitempty"`
}

// jsonSourceLost is why, and since when, the leader cannot follow its source.
type jsonSourceLost struct {
	Error         string     `json:"error"`
	Since         *time.Time `json:"since"`
	Misconfigured bool       `json:"misconfigured"`
}

func statusJSON(st *pb.StatusResponse) jsonStatus {
	out := jsonStatus{
		Leader: st.GetLeader(), LeaderAddress: st.GetLeaderAddress(), Position: positionJSON(st.GetPosition()),
		Clock: st.GetClock(), Generation: st.GetGeneration(), Imbalance: jsonFloat(st.GetImbalance()), Slices: st.GetSlices(),
		Nodes: st.GetNodes(), Frozen: st.GetFrozen(), Algorithm: st.GetAlgorithm(), Params: st.GetParams(),
		LastPass: jsonTime(st.GetLastPass()), Pinned: []jsonRange{}, Handoffs: st.GetHandoffs(),
		Quarantined: quarantinesJSON(st.GetQuarantined()), Roles: st.GetRoles(), Exclusive: st.GetExclusive(),
		NodeTTL: st.GetNodeTtl().AsDuration().String(), MinReplicas: st.GetMinReplicas(),
		jsonPassFailures: jsonPassFailures{PassFailures: st.GetPassFailures(), PassError: st.GetPassError(),
			PassErrorTime: jsonTime(st.GetPassErrorTime())},
	}
	if out.Params == nil {
		out.Params = map[string]string{}
	}
	if st.GetSourceError() != "" {
		out.Source = &jsonSourceLost{Error: st.GetSourceError(), Since: jsonTime(st.GetSourceLostSince()),
			Misconfigured: st.GetSourceMisconfigured()}
	}
	for _, r := range st.GetPinned() {
		out.Pinned = append(out.Pinned, rangeJSON(r))
	}
	return out
}

func newStatusCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the leading assigner's state: position, clock, imbalance, algorithm",
		Long: `status shows what the leading assigner knows about itself: its address and
term, the position (term/seq) and Lamport clock of its last quantum, the map's
generation, the imbalance of the node loads (max over mean of load over
capacity; 1 is perfect), the numbers of slices and nodes, whether balancing is
frozen, the role model (replicas, or primary-secondary, and whether primaries
hold leases: exclusive) with the node TTL, the balancing algorithm and the
constants set for it, when the last
balancing pass ran, the ranges pinned in place, and the ranges in quarantine
(held by no node: nodes crashed twice shortly after acquiring them; slicectl
unquarantine lifts one); while slices are handed off
make-before-break, "handoffs" counts them. When balancing passes fail,
"balancing" says so: how many failed in a row, when the last did and why.
While the leader cannot reach its data source, "source" says since when and
why, and balancing passes are held (the leader keeps its term and serves).`,
		Example: `  slicectl status
  slicectl status -o json | jq .imbalance
  slicectl --assigner 10.0.0.1:7070,10.0.0.2:7070 status`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				st, err := s.admin.Status(ctx, &pb.StatusRequest{})
				if err != nil {
					return err
				}
				if !s.out.table() {
					out := statusJSON(st)
					out.Target = s.target()
					return s.out.print(out)
				}
				return printStatus(s, st)
			})
		},
	}
}

// showRoles says the cluster's role model, whether primaries hold leases, and the lease.
func showRoles(st *pb.StatusResponse) string {
	ttl := st.GetNodeTtl().AsDuration()
	switch {
	case st.GetRoles() == "":
		return "unknown (an assigner older than this slicectl)"
	case st.GetExclusive():
		return fmt.Sprintf("%s, exclusive: a primary acts only within its lease (--node-ttl %s)", st.GetRoles(), ttl)
	}
	return fmt.Sprintf("%s; members and nodes leave the map %s after their last heartbeat (--node-ttl)", st.GetRoles(), ttl)
}

func printStatus(s *session, st *pb.StatusResponse) error {
	w := newTable(s.out.w)
	leader := "no"
	if st.GetLeader() {
		leader = "yes, at " + st.GetLeaderAddress()
	} else if st.GetLeaderAddress() != "" {
		leader = "no; the leader is at " + st.GetLeaderAddress()
	}
	balancing := "running"
	switch f := showPassFailures(st.GetPassFailures(), st.GetPassError(), st.GetPassErrorTime()); {
	case st.GetFrozen():
		balancing = "frozen (passes do not run; slicectl unfreeze resumes them)"
	case st.GetSourceError() != "":
		balancing = "held until the source answers (only departed nodes' slices move)"
	case f != "":
		balancing = f
	}
	row(w, "target", s.target())
	row(w, "leader", leader)
	row(w, "term", fmt.Sprint(st.GetPosition().GetTerm()))
	row(w, "position", showPosition(st.GetPosition()))
	row(w, "clock", fmt.Sprint(st.GetClock()))
	row(w, "generation", fmt.Sprint(st.GetGeneration()))
	row(w, "imbalance", num(st.GetImbalance()))
	row(w, "slices", fmt.Sprint(st.GetSlices()))
	row(w, "nodes", fmt.Sprint(st.GetNodes()))
	row(w, "roles", showRoles(st))
	if n := st.GetMinReplicas(); n > 1 {
		row(w, "replicas", fmt.Sprintf("at least %d a slice while that many nodes live (--min-replicas)", n))
	}
	if st.GetHandoffs() > 0 {
		row(w, "handoffs", fmt.Sprintf("%d slices moving (loading on their new nodes, or served by both while the old ones linger)", st.GetHandoffs()))
	}
	if e := st.GetSourceError(); e != "" {
		what := "unreachable"
		if st.GetSourceMisconfigured() {
			what = "misconfigured"
		}
		row(w, "source", fmt.Sprintf("%s since %s: %s", what, showTime(st.GetSourceLostSince(), time.Now()), e))
	}
	row(w, "balancing", balancing)
	row(w, "algorithm", st.GetAlgorithm()+" "+showParams(st.GetParams()))
	row(w, "last pass", showTime(st.GetLastPass(), time.Now()))
	if len(st.GetPinned()) == 0 {
		row(w, "pinned", "none")
	}
	for i, r := range st.GetPinned() {
		label := ""
		if i == 0 {
			label = "pinned"
		}
		row(w, label, showRange(r))
	}
	printQuarantined(w, st.GetQuarantined())
	return w.Flush()
}
