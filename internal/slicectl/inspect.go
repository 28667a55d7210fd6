package slicectl

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// The inspect commands: status, nodes, slices, lookup, explain (quanta is in quanta.go).

type jsonStatus struct {
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
	jsonPassFailures
}

// jsonPassFailures says whether balancing passes are failing: how many in a row (0 once one
// succeeds), and why and when the last failed one did.
type jsonPassFailures struct {
	PassFailures  uint64     `json:"pass_failures"`
	PassError     string     `json:"pass_error,omitempty"`
	PassErrorTime *time.Time `json:"pass_error_time,omitempty"`
}

// showPassFailures says that passes are failing, or "" when the last one succeeded.
func showPassFailures(n uint64, why string, at *timestamppb.Timestamp) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("FAILING: %d passes in a row, the last %s: %s (only the clean-up of departed nodes runs)",
		n, showTime(at, time.Now()), why)
}

func statusJSON(st *pb.StatusResponse) jsonStatus {
	out := jsonStatus{
		Leader: st.GetLeader(), LeaderAddress: st.GetLeaderAddress(), Position: positionJSON(st.GetPosition()),
		Clock: st.GetClock(), Generation: st.GetGeneration(), Imbalance: jsonFloat(st.GetImbalance()), Slices: st.GetSlices(),
		Nodes: st.GetNodes(), Frozen: st.GetFrozen(), Algorithm: st.GetAlgorithm(), Params: st.GetParams(),
		LastPass: jsonTime(st.GetLastPass()), Pinned: []jsonRange{},
		jsonPassFailures: jsonPassFailures{PassFailures: st.GetPassFailures(), PassError: st.GetPassError(),
			PassErrorTime: jsonTime(st.GetPassErrorTime())},
	}
	if out.Params == nil {
		out.Params = map[string]string{}
	}
	for _, r := range st.GetPinned() {
		out.Pinned = append(out.Pinned, rangeJSON(r))
	}
	return out
}

// showParams writes an algorithm's constants as k=v, sorted, or "defaults".
func showParams(params map[string]string) string {
	if len(params) == 0 {
		return "(default constants)"
	}
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(params)) {
		kv = append(kv, k+"="+params[k])
	}
	return strings.Join(kv, " ")
}

func newStatusCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the leading assigner's state: position, clock, imbalance, algorithm",
		Long: `status shows what the leading assigner knows about itself: its address and
term, the position (term/seq) and Lamport clock of its last quantum, the map's
generation, the imbalance of the node loads (max over mean of load over
capacity; 1 is perfect), the numbers of slices and nodes, whether balancing is
frozen, the balancing algorithm and the constants set for it, when the last
balancing pass ran, and the ranges pinned in place. When balancing passes fail,
"balancing" says so: how many failed in a row, when the last did and why.`,
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
					return s.out.print(statusJSON(st))
				}
				return printStatus(s, st)
			})
		},
	}
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
	if st.GetFrozen() {
		balancing = "frozen (passes do not run; slicectl unfreeze resumes them)"
	} else if f := showPassFailures(st.GetPassFailures(), st.GetPassError(), st.GetPassErrorTime()); f != "" {
		balancing = f
	}
	row(w, "leader", leader)
	row(w, "term", fmt.Sprint(st.GetPosition().GetTerm()))
	row(w, "position", showPosition(st.GetPosition()))
	row(w, "clock", fmt.Sprint(st.GetClock()))
	row(w, "generation", fmt.Sprint(st.GetGeneration()))
	row(w, "imbalance", num(st.GetImbalance()))
	row(w, "slices", fmt.Sprint(st.GetSlices()))
	row(w, "nodes", fmt.Sprint(st.GetNodes()))
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
	return w.Flush()
}

type jsonNode struct {
	ID       string            `json:"id"`
	Address  string            `json:"address"`
	Capacity jsonFloat         `json:"capacity"`
	Labels   map[string]string `json:"labels"`
	Slices   uint32            `json:"slices"`
	Load     jsonFloat         `json:"load"`
	Draining bool              `json:"draining"`
	// Stale and SilenceSeconds are what the node last said about its pull stream.
	Stale          bool       `json:"stale"`
	SilenceSeconds float64    `json:"silence_seconds,omitempty"`
	LastSeen       *time.Time `json:"last_seen"`
}

type jsonNodes struct {
	Nodes []jsonNode `json:"nodes"`
}

// capacity returns a node's capacity weight: 0 means 1.
func capacity(n *pb.Node) float64 {
	if n.GetCapacity() == 0 {
		return 1
	}
	return n.GetCapacity()
}

func newNodesCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List the registered nodes with their slices and load",
		Long: `nodes lists the registered storage nodes by ID: the address they serve on, their
capacity weight, how many slices they hold (replicas included), their estimated
load over their capacity (the unit the nodes report in), whether they are being
drained, whether their data is fresh (DATA: "stale" with how long the node has not
heard from its distributor, "-" before its first heartbeat says), and when the
assigner last heard from them. A node that stays silent
for the assigner's --node-ttl leaves the map.`,
		Example: `  slicectl nodes
  slicectl nodes -o json | jq '.nodes[] | select(.draining)'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.ListNodes(ctx, &pb.ListNodesRequest{})
				if err != nil {
					return err
				}
				if !s.out.table() {
					out := jsonNodes{Nodes: []jsonNode{}}
					for _, n := range resp.GetNodes() {
						labels := n.GetLabels()
						if labels == nil {
							labels = map[string]string{}
						}
						out.Nodes = append(out.Nodes, jsonNode{ID: n.GetNode().GetId(), Address: n.GetAddress(),
							Capacity: jsonFloat(capacity(n.GetNode())), Labels: labels, Slices: n.GetSlices(), Load: jsonFloat(n.GetLoad()),
							Draining: n.GetDraining(), Stale: n.GetStale(), SilenceSeconds: n.GetSilence().AsDuration().Seconds(),
							LastSeen: jsonTime(n.GetLastSeen())})
					}
					return s.out.print(out)
				}
				return printNodes(s, resp.GetNodes())
			})
		},
	}
}

func printNodes(s *session, nodes []*pb.NodeInfo) error {
	if len(nodes) == 0 {
		_, err := fmt.Fprintln(s.out.w, "no node is registered")
		return err
	}
	labels := slices.ContainsFunc(nodes, func(n *pb.NodeInfo) bool { return len(n.GetLabels()) > 0 })
	w := newTable(s.out.w)
	header := []string{"ID", "ADDRESS", "CAPACITY", "SLICES", "LOAD", "DRAINING", "DATA", "LAST SEEN"}
	if labels {
		header = append(header, "LABELS")
	}
	row(w, header...)
	now := time.Now()
	for _, n := range nodes {
		seen := "never"
		if n.GetLastSeen() != nil {
			seen = ago(n.GetLastSeen().AsTime(), now)
		}
		cells := []string{n.GetNode().GetId(), n.GetAddress(), num(capacity(n.GetNode())), fmt.Sprint(n.GetSlices()),
			num(n.GetLoad()), yesNo(n.GetDraining()), dataFreshness(n), seen}
		if labels {
			cells = append(cells, showParams(n.GetLabels()))
		}
		row(w, cells...)
	}
	return w.Flush()
}

type jsonSlice struct {
	jsonRange
	Replicas []string  `json:"replicas"`
	Load     jsonFloat `json:"load"`
	Keys     jsonFloat `json:"keys"`
	Pinned   bool      `json:"pinned"`
}

type jsonSlices struct {
	// Total is how many slices matched, of which Slices lists the first --limit.
	Total  uint32      `json:"total"`
	Slices []jsonSlice `json:"slices"`
}

func newSlicesCommand(g *globalOptions) *cobra.Command {
	var (
		node, sortBy string
		limit        int
	)
	cmd := &cobra.Command{
		Use:   "slices",
		Short: "List the slices with their replicas and load",
		Long: `slices lists the slices of the map: the range of the hash space each covers, the
nodes holding it, its estimated load and number of keys (as the nodes last
reported them), and whether it is pinned. --node keeps the slices one node
holds; --sort load lists the hottest first; --limit caps the listing (the
assigner caps it at 1000 when --limit is 0).`,
		Example: `  slicectl slices
  slicectl slices --node n3
  slicectl slices --sort load --limit 10
  slicectl slices -o json | jq '.slices[] | select(.pinned)'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sortBy != "key" && sortBy != "load" {
				return usageError(fmt.Errorf("--sort %q: want key or load", sortBy))
			}
			if limit < 0 {
				return usageError(fmt.Errorf("--limit %d: want 0 (the assigner's cap, 1000) or more", limit))
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.ListSlices(ctx, &pb.ListSlicesRequest{Node: node, ByLoad: sortBy == "load", Limit: uint32(limit)})
				if err != nil {
					return err
				}
				if !s.out.table() {
					out := jsonSlices{Total: resp.GetTotal(), Slices: []jsonSlice{}}
					for _, sl := range resp.GetSlices() {
						out.Slices = append(out.Slices, jsonSlice{jsonRange: rangeJSON(sl.GetRange()), Replicas: sl.GetReplicas(),
							Load: jsonFloat(sl.GetLoad()), Keys: jsonFloat(sl.GetKeys()), Pinned: sl.GetPinned()})
					}
					return s.out.print(out)
				}
				return printSlices(s, resp, node)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "list only the slices this node holds")
	f.StringVar(&sortBy, "sort", "key", "order: key (hash order) or load (hottest first)")
	f.IntVar(&limit, "limit", 0, "list at most this many slices; 0 is the assigner's cap, 1000")
	_ = cmd.RegisterFlagCompletionFunc("node", g.completeNodes)
	_ = cmd.RegisterFlagCompletionFunc("sort", cobra.FixedCompletions([]string{"key", "load"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func printSlices(s *session, resp *pb.ListSlicesResponse, node string) error {
	w := newTable(s.out.w)
	row(w, "START", "END", "REPLICAS", "LOAD", "KEYS", "PINNED")
	for _, sl := range resp.GetSlices() {
		r := rangeOf(sl.GetRange())
		row(w, keyspace.FormatPoint(r.Start), r.End.String(), showNodes(sl.GetReplicas()), num(sl.GetLoad()),
			num(sl.GetKeys()), yesNo(sl.GetPinned()))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	summary := fmt.Sprintf("%d slices", resp.GetTotal())
	if node != "" {
		summary = fmt.Sprintf("%d slices held by %s", resp.GetTotal(), node)
	}
	if n := len(resp.GetSlices()); uint32(n) < resp.GetTotal() {
		summary = fmt.Sprintf("%d of %s (--limit)", n, summary)
	}
	_, err := fmt.Fprintln(s.out.w, summary)
	return err
}

type jsonLookup struct {
	Key        *string   `json:"key,omitempty"`
	Hash       string    `json:"hash"`
	Slice      jsonRange `json:"slice"`
	Replicas   []string  `json:"replicas"`
	Generation uint64    `json:"generation"`
}

func newLookupCommand(g *globalOptions) *cobra.Command {
	var hash string
	cmd := &cobra.Command{
		Use:   "lookup [KEY | --hash POINT]",
		Short: "Show the slice and replicas holding a key or a hash",
		Long: `lookup shows where a key lives now: its hash (xxhash64 of the key), the slice
holding that point of the hash space, the nodes holding the slice, and the
generation of the map the answer comes from. --hash looks up a point instead
of a key.`,
		Example: `  slicectl lookup user:42
  slicectl lookup --hash 0x8000000000000000
  slicectl lookup user:42 -o json | jq -r '.replicas[0]'`,
		Args: positional("KEY")(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &pb.LookupRequest{}
			var key *string
			switch {
			case len(args) == 1 && cmd.Flags().Changed("hash"):
				return usageError(fmt.Errorf("KEY %q and --hash %s: give one or the other", args[0], hash))
			case len(args) == 1:
				if args[0] == "" {
					return usageError(fmt.Errorf("KEY is empty"))
				}
				key = &args[0]
				req.Target = &pb.LookupRequest_Key{Key: []byte(args[0])}
			case cmd.Flags().Changed("hash"):
				h, err := keyspace.ParsePoint(hash)
				if err != nil {
					return usageError(fmt.Errorf("--hash: %w", err))
				}
				req.Target = &pb.LookupRequest_Hash{Hash: h}
			default:
				return usageError(fmt.Errorf("missing KEY: give a key or --hash (usage: %s)", cmd.UseLine()))
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.assign.Lookup(ctx, req)
				if err != nil {
					return err
				}
				out := jsonLookup{Key: key, Hash: keyspace.FormatPoint(resp.GetHash()), Slice: rangeJSON(resp.GetSlice()),
					Replicas: resp.GetReplicas(), Generation: resp.GetGeneration()}
				if !s.out.table() {
					return s.out.print(out)
				}
				w := newTable(s.out.w)
				if key != nil {
					row(w, "key", fmt.Sprintf("%q", *key))
				}
				row(w, "hash", out.Hash)
				row(w, "slice", showRange(resp.GetSlice()))
				row(w, "replicas", showNodes(resp.GetReplicas()))
				row(w, "generation", fmt.Sprint(resp.GetGeneration()))
				return w.Flush()
			})
		},
	}
	cmd.Flags().StringVar(&hash, "hash", "", "look up this point of the hash space (0x-prefixed hex or decimal) instead of a key")
	return cmd
}

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
	jsonPassFailures
}

func explainJSON(x *pb.ExplainResponse, frozen bool) jsonExplain {
	out := jsonExplain{
		Passed: x.GetPassed(), Frozen: frozen, Position: positionJSON(x.GetPosition()), Algorithm: x.GetAlgorithm(),
		ImbalanceBefore: jsonFloat(x.GetImbalanceBefore()), ImbalanceAfter: jsonFloat(x.GetImbalanceAfter()), ChurnBudget: jsonFloat(x.GetChurnBudget()),
		Churn:  jsonChurn{Cleanup: jsonFloat(x.GetChurnCleanup()), Merge: jsonFloat(x.GetChurnMerge()), Move: jsonFloat(x.GetChurnMove())},
		Splits: x.GetSplits(), Merges: x.GetMerges(), Moves: x.GetMoves(), ReplicasAdded: x.GetReplicasAdded(),
		ReplicasRemoved: x.GetReplicasRemoved(), Reassigned: x.GetReassigned(), Stop: x.GetStop(),
		Candidates: []jsonCandidate{},
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

It also says when balancing is frozen, as then no pass runs at all, and when
passes are failing: how many in a row, and why the last one failed; what follows
is then the last pass that succeeded.`,
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

// dataFreshness describes what a node said about its pull stream: "fresh", "stale/12s"
// (silent for 12 s), or "-" when it said nothing yet.
func dataFreshness(n *pb.NodeInfo) string {
	switch {
	case n.GetStale() && n.GetSilence() != nil:
		return "stale/" + n.GetSilence().AsDuration().Round(time.Second).String()
	case n.GetStale():
		return "stale"
	case n.GetSilence() != nil:
		return "fresh"
	}
	return "-"
}
