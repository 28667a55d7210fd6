package slicectl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/logging/logtest"
)

// assignerEnv is a running cluster (an embedded etcd, one assigner, four nodes) and RPC
// clients of its leader, to check the commands' output against the assigner's own answers.
type assignerEnv struct {
	t      *testing.T
	c      *clustertest.Cluster
	addr   string
	admin  pb.AdminServiceClient
	assign pb.AssignmentServiceClient
	// standbyAt is where the next assigner listens, when set (ctlStandby).
	standbyAt string
}

var envNodes = []string{"n1", "n2", "n3", "n4"}

func newAssignerEnv(t *testing.T) *assignerEnv {
	// No distributor: the nodes hold no data, so moves take effect at once rather than as
	// handoffs that would wait for the nodes to load (handoff_test.go shows those).
	e := &assignerEnv{t: t}
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		cfg.Core.BreakBeforeMake = true
		if e.standbyAt != "" { // ctlStandby's: an address that does not own the default target
			cfg.Listen = e.standbyAt
		}
	}})
	for _, id := range envNodes {
		c.StartNode(id, nil)
	}
	conn := c.Conn()
	e.c, e.addr, e.admin, e.assign = c, c.Assigners()[0], pb.NewAdminServiceClient(conn), pb.NewAssignmentServiceClient(conn)
	waitFor(t, 30*time.Second, "every node registered, a map made and a balancing pass run", func() bool {
		st := e.status()
		return st.GetNodes() == uint32(len(envNodes)) && st.GetSlices() > 0 && st.GetLastPass() != nil
	})
	return e
}

// ctl runs slicectl against the cluster's assigner.
func (e *assignerEnv) ctl(args ...string) (string, string, error) {
	e.t.Helper()
	return run(e.t, append([]string{"--assigner", e.addr}, args...)...)
}

// ok runs a command that must succeed and returns its stdout.
func (e *assignerEnv) ok(args ...string) string {
	e.t.Helper()
	out, errOut, err := e.ctl(args...)
	require.NoError(e.t, err, "%s\nstderr: %s", strings.Join(args, " "), errOut)
	return out
}

// okJSON runs a command with -o json and decodes its output into v.
func (e *assignerEnv) okJSON(v any, args ...string) {
	e.t.Helper()
	out := e.ok(append(args, "-o", "json")...)
	require.NoError(e.t, json.Unmarshal([]byte(out), v), out)
}

func (e *assignerEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *assignerEnv) status() *pb.StatusResponse {
	e.t.Helper()
	st, err := e.admin.Status(e.ctx(), &pb.StatusRequest{}, grpc.WaitForReady(true))
	require.NoError(e.t, err)
	return st
}

func (e *assignerEnv) lookup(h uint64) *pb.LookupResponse {
	e.t.Helper()
	resp, err := e.assign.Lookup(e.ctx(), &pb.LookupRequest{Target: &pb.LookupRequest_Hash{Hash: h}}, grpc.WaitForReady(true))
	require.NoError(e.t, err)
	return resp
}

func (e *assignerEnv) nodes() map[string]*pb.NodeInfo {
	e.t.Helper()
	resp, err := e.admin.ListNodes(e.ctx(), &pb.ListNodesRequest{}, grpc.WaitForReady(true))
	require.NoError(e.t, err)
	out := map[string]*pb.NodeInfo{}
	for _, n := range resp.GetNodes() {
		out[n.GetNode().GetId()] = n
	}
	return out
}

func (e *assignerEnv) slices(node string) *pb.ListSlicesResponse {
	e.t.Helper()
	resp, err := e.admin.ListSlices(e.ctx(), &pb.ListSlicesRequest{Node: node}, grpc.WaitForReady(true))
	require.NoError(e.t, err)
	return resp
}

// sliceOn returns a slice that node holds alone.
func (e *assignerEnv) sliceOn(node string) keyspace.Range {
	e.t.Helper()
	for _, s := range e.slices(node).GetSlices() {
		if slices.Equal(s.GetReplicas(), []string{node}) {
			return rangeOf(s.GetRange())
		}
	}
	e.t.Fatalf("%s holds no slice alone", node)
	return keyspace.Range{}
}

// busiest returns the node holding the most slices, and another node.
func (e *assignerEnv) busiest() (string, string) {
	e.t.Helper()
	ns := e.nodes()
	best := envNodes[0]
	for _, id := range envNodes {
		if ns[id].GetSlices() > ns[best].GetSlices() {
			best = id
		}
	}
	other := envNodes[0]
	if other == best {
		other = envNodes[1]
	}
	return best, other
}

// waitFor polls cond until it holds, and fails the test if it does not within the deadline.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The JSON forms, as a script would read them.
type (
	posOut   struct{ Term, Seq uint64 }
	rangeOut struct{ Start, End string }
	opOut    struct {
		Op, Slice, At, Left string
		Replicas            []string
	}
	changeOut struct {
		Summary    string
		Position   posOut
		Generation uint64
		Ops        []opOut
	}
	statusOut struct {
		Leader        bool
		LeaderAddress string `json:"leader_address"`
		Position      posOut
		Clock         uint64
		Generation    uint64
		Imbalance     float64
		Slices, Nodes uint32
		Frozen        bool
		Algorithm     string
		Params        map[string]string
		LastPass      *time.Time `json:"last_pass"`
		Pinned        []rangeOut
	}
)

func formatRange(r keyspace.Range) rangeOut {
	return rangeOut{Start: keyspace.FormatPoint(r.Start), End: r.End.String()}
}

func TestAgainstAnAssigner(t *testing.T) {
	e := newAssignerEnv(t)
	// Balancing stays frozen, so that the map changes only as the commands change it (drain,
	// which needs passes, unfreezes it).
	_, err := e.admin.Freeze(e.ctx(), &pb.FreezeRequest{Reason: "slicectl test"}, grpc.WaitForReady(true))
	require.NoError(t, err)

	t.Run("status", func(t *testing.T) { ctlStatus(t, e) })

	t.Run("nodes", func(t *testing.T) { ctlNodes(t, e) })

	t.Run("slices", func(t *testing.T) { ctlSlices(t, e) })

	t.Run("lookup", func(t *testing.T) { ctlLookup(t, e) })

	t.Run("quanta", func(t *testing.T) { ctlQuanta(t, e) })

	t.Run("explain", func(t *testing.T) { ctlExplain(t, e) })

	t.Run("move", func(t *testing.T) { ctlMove(t, e) })

	t.Run("split and merge", func(t *testing.T) { ctlSplitAndMerge(t, e) })

	t.Run("pin and unpin", func(t *testing.T) { ctlPinAndUnpin(t, e) })

	t.Run("unquarantine", func(t *testing.T) { ctlUnquarantine(t, e) })

	t.Run("freeze and unfreeze", func(t *testing.T) { ctlFreezeAndUnfreeze(t, e) })

	t.Run("algorithm", func(t *testing.T) { ctlAlgorithm(t, e) })

	t.Run("quanta follow", func(t *testing.T) { ctlQuantaFollow(t, e) })

	t.Run("completion of node IDs", func(t *testing.T) { ctlCompletionOfNodeIDs(t, e) })

	t.Run("drain", func(t *testing.T) { ctlDrain(t, e) })

	t.Run("standby", func(t *testing.T) { ctlStandby(t, e) })
}

func ctlStatus(t *testing.T, e *assignerEnv) {
	st := e.status()
	out := e.ok("status")
	assert.Regexp(t, `(?m)^leader\s+yes, at `+e.addr+`$`, out)
	assert.Regexp(t, fmt.Sprintf(`(?m)^term\s+%d$`, st.GetPosition().GetTerm()), out)
	assert.Regexp(t, fmt.Sprintf(`(?m)^generation\s+%d$`, st.GetGeneration()), out)
	assert.Regexp(t, fmt.Sprintf(`(?m)^slices\s+%d$`, st.GetSlices()), out)
	assert.Regexp(t, `(?m)^nodes\s+4$`, out)
	assert.Regexp(t, `(?m)^balancing\s+frozen`, out)
	assert.Regexp(t, `(?m)^algorithm\s+weighted-move \(default constants\)$`, out)
	assert.Regexp(t, `(?m)^last pass\s+\d{4}-\d\d-\d\d .* ago\)$`, out)
	assert.Regexp(t, `(?m)^pinned\s+none$`, out)
	assert.Regexp(t, `(?m)^quarantined\s+none$`, out)

	var got statusOut
	e.okJSON(&got, "status")
	assert.True(t, got.Leader)
	assert.Equal(t, e.addr, got.LeaderAddress)
	assert.Equal(t, st.GetPosition().GetTerm(), got.Position.Term)
	assert.GreaterOrEqual(t, got.Position.Seq, st.GetPosition().GetSeq())
	assert.Equal(t, st.GetGeneration(), got.Generation)
	assert.Equal(t, st.GetSlices(), got.Slices)
	assert.Equal(t, uint32(4), got.Nodes)
	assert.True(t, got.Frozen)
	assert.Equal(t, "weighted-move", got.Algorithm)
	assert.Equal(t, map[string]string{}, got.Params)
	require.NotNil(t, got.LastPass)
	assert.WithinDuration(t, st.GetLastPass().AsTime(), *got.LastPass, time.Millisecond)
	assert.Equal(t, []rangeOut{}, got.Pinned)

	var doc map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(e.ok("status", "-o", "yaml")), &doc))
	assert.Equal(t, true, doc["leader"])
	assert.Equal(t, 4, doc["nodes"])
	assert.Equal(t, "weighted-move", doc["algorithm"])
	assert.Equal(t, map[string]any{"term": int(st.GetPosition().GetTerm()), "seq": doc["position"].(map[string]any)["seq"]}, doc["position"])
}

func ctlNodes(t *testing.T, e *assignerEnv) {
	want := e.nodes()
	out := e.ok("nodes")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 5, out)
	assert.Equal(t, []string{"ID", "ADDRESS", "CAPACITY", "SLICES", "LOAD", "DRAINING", "DATA", "LAST", "SEEN"}, strings.Fields(lines[0]))
	for i, id := range envNodes {
		f := strings.Fields(lines[i+1])
		require.GreaterOrEqual(t, len(f), 8, lines[i+1])
		assert.Equal(t, []string{id, "127.0.0.1:1", "1", fmt.Sprint(want[id].GetSlices()), "0", "no"}, f[:6])
		assert.Equal(t, "ago", f[len(f)-1])
	}
	// The columns line up.
	col := strings.Index(lines[0], "SLICES")
	for _, l := range lines[1:] {
		assert.NotEqual(t, ' ', l[col], "%q", l)
		assert.Equal(t, byte(' '), l[col-1], "%q", l)
	}

	var got struct {
		Nodes []struct {
			ID, Address string
			Capacity    float64
			Labels      map[string]string
			Slices      uint32
			Load        float64
			Draining    bool
			LastSeen    time.Time `json:"last_seen"`
		}
	}
	e.okJSON(&got, "nodes")
	require.Len(t, got.Nodes, 4)
	for i, n := range got.Nodes {
		assert.Equal(t, envNodes[i], n.ID)
		assert.Equal(t, "127.0.0.1:1", n.Address)
		assert.Equal(t, 1.0, n.Capacity)
		assert.Equal(t, want[n.ID].GetSlices(), n.Slices)
		assert.False(t, n.Draining)
		assert.WithinDuration(t, time.Now(), n.LastSeen, time.Minute)
	}
}

func ctlSlices(t *testing.T, e *assignerEnv) {
	node, _ := e.busiest()
	want := e.slices(node)
	var got struct {
		Total  uint32
		Slices []struct {
			Start, End string
			Replicas   []string
			Load, Keys float64
			Pinned     bool
		}
	}
	e.okJSON(&got, "slices", "--node", node)
	assert.Equal(t, want.GetTotal(), got.Total)
	require.Len(t, got.Slices, len(want.GetSlices()))
	for i, s := range got.Slices {
		assert.Equal(t, formatRange(rangeOf(want.GetSlices()[i].GetRange())), rangeOut{s.Start, s.End})
		assert.Contains(t, s.Replicas, node)
	}

	all := e.status().GetSlices()
	e.okJSON(&got, "slices", "--sort", "load", "--limit", "5")
	assert.Equal(t, all, got.Total)
	assert.Len(t, got.Slices, 5)

	out := e.ok("slices", "--limit", "3")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 5, out)
	assert.Equal(t, []string{"START", "END", "REPLICAS", "LOAD", "KEYS", "PINNED"}, strings.Fields(lines[0]))
	assert.Equal(t, []string{"0x0000000000000000"}, strings.Fields(lines[1])[:1], "key order, from the start of the space")
	assert.Equal(t, fmt.Sprintf("3 of %d slices (--limit)", all), lines[4])

	_, _, err := e.ctl("slices", "--node", "nope")
	require.ErrorIs(t, err, ErrRefused)
	assert.EqualError(t, err, "refused: unknown node: nope is not registered")
}

func ctlLookup(t *testing.T, e *assignerEnv) {
	h := keyspace.Hash([]byte("user:1"))
	want := e.lookup(h)
	var got struct {
		Key, Hash  string
		Slice      rangeOut
		Replicas   []string
		Generation uint64
	}
	e.okJSON(&got, "lookup", "user:1")
	assert.Equal(t, "user:1", got.Key)
	assert.Equal(t, keyspace.FormatPoint(h), got.Hash)
	assert.Equal(t, formatRange(rangeOf(want.GetSlice())), got.Slice)
	assert.Equal(t, want.GetReplicas(), got.Replicas)
	assert.Equal(t, want.GetGeneration(), got.Generation)

	out := e.ok("lookup", "--hash", "0x8000000000000000")
	mid := e.lookup(1 << 63)
	assert.Regexp(t, `(?m)^hash\s+0x8000000000000000$`, out)
	assert.Regexp(t, `(?m)^slice\s+`+regexpQuote(showRange(mid.GetSlice()))+`$`, out)
	assert.Regexp(t, `(?m)^replicas\s+`+strings.Join(mid.GetReplicas(), ",")+`$`, out)
	assert.NotContains(t, out, "key")
}

func ctlQuanta(t *testing.T, e *assignerEnv) {
	resp, err := e.admin.ListQuanta(e.ctx(), &pb.ListQuantaRequest{Limit: 0}, grpc.WaitForReady(true))
	require.NoError(t, err)
	want := resp.GetQuanta()
	require.NotEmpty(t, want)
	got := quantaLines(t, e.ok("quanta", "--limit", "0", "-o", "json"))
	require.Len(t, got, len(want))
	for i, q := range got {
		assert.Equal(t, posOut{want[i].GetPosition().GetTerm(), want[i].GetPosition().GetSeq()}, q.Position)
		assert.Equal(t, want[i].GetCause(), q.Cause)
		assert.Equal(t, want[i].GetBy(), q.By)
		assert.Equal(t, want[i].GetGeneration(), q.Generation)
		assert.Len(t, q.Ops, len(want[i].GetOps()))
	}
	// The nodes' registrations come first: the first map waits for them.
	first := slices.IndexFunc(got, func(q quantumOut) bool { return q.By == "" })
	require.GreaterOrEqual(t, first, 0, "the assigner's own quanta are listed")
	assert.Equal(t, "initial", got[first].Cause, "the first map is in the history")
	assert.True(t, got[first].Reinitializing)
	for _, q := range got[:first] {
		assert.True(t, strings.HasPrefix(q.Cause, "node: "), q.Cause)
		assert.True(t, strings.HasPrefix(q.By, "plaintext:127.0.0.1:"), "the caller's address, without TLS: %s", q.By)
	}

	out := e.ok("quanta", "--limit", "2")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, min(3, len(want)+1), out)
	assert.Equal(t, []string{"POSITION", "CLOCK", "GENERATION", "TIME", "OPS", "BY", "CAUSE"}, strings.Fields(lines[0]))
	last := want[len(want)-1]
	assert.Equal(t, []string{showPosition(last.GetPosition()), fmt.Sprint(last.GetClock()), fmt.Sprint(last.GetGeneration())},
		strings.Fields(lines[len(lines)-1])[:3])
}

func ctlExplain(t *testing.T, e *assignerEnv) {
	x, err := e.admin.Explain(e.ctx(), &pb.ExplainRequest{}, grpc.WaitForReady(true))
	require.NoError(t, err)
	require.True(t, x.GetPassed(), "passes ran before the freeze")
	var got struct {
		Passed, Frozen        bool
		Algorithm, Stop       string
		ImbalanceBefore       float64 `json:"imbalance_before"`
		ImbalanceAfter        float64 `json:"imbalance_after"`
		ChurnBudget           float64 `json:"churn_budget"`
		Churn                 struct{ Cleanup, Merge, Move float64 }
		Splits, Merges, Moves uint32
		ReplicasAdded         uint32 `json:"replicas_added"`
		Candidates            []struct{ Action, Reason string }
		Position              posOut
	}
	e.okJSON(&got, "explain")
	assert.True(t, got.Passed)
	assert.True(t, got.Frozen)
	assert.Equal(t, x.GetAlgorithm(), got.Algorithm)
	assert.Equal(t, x.GetStop(), got.Stop)
	assert.NotEmpty(t, got.Stop, "a pass says why it stopped")
	assert.Equal(t, x.GetImbalanceBefore(), got.ImbalanceBefore)
	assert.Equal(t, x.GetChurnBudget(), got.ChurnBudget)
	assert.Equal(t, x.GetMoves(), got.Moves)
	assert.Len(t, got.Candidates, len(x.GetCandidates()))

	out := e.ok("explain")
	assert.Contains(t, out, "balancing is frozen: no pass runs until slicectl unfreeze")
	assert.Regexp(t, `(?m)^algorithm\s+weighted-move$`, out)
	assert.Regexp(t, `(?m)^stopped\s+`+regexp.QuoteMeta(x.GetStop())+`$`, out)
	assert.Regexp(t, `(?m)^churn\s+[0-9.]+% of keys \(clean-up [0-9.]+%, merge [0-9.]+%, move [0-9.]+%; budget (9|30)%\)$`, out) // 30% if the last pass found a node empty
	assert.Regexp(t, fmt.Sprintf(`(?m)^did\s+%d splits, %d merges, %d moves`, x.GetSplits(), x.GetMerges(), x.GetMoves()), out)
}

func ctlMove(t *testing.T, e *assignerEnv) {
	from, to := e.busiest()
	r := e.sliceOn(from)
	gen := e.status().GetGeneration()
	start := keyspace.FormatPoint(r.Start)

	out := e.ok("move", start, "--to", to)
	assert.Equal(t, fmt.Sprintf(`move %s from %s to %s
  quantum %s, generation %d, 1 operation:
    assign the slice at %s to %s
`, r, from, to, showPosition(e.status().GetPosition()), gen+1, start, to), out)
	assert.Equal(t, []string{to}, e.lookup(r.Start).GetReplicas())

	// To two nodes, by a key in the slice, as JSON.
	var ch changeOut
	e.okJSON(&ch, "move", "hash:"+keyspace.FormatPoint(r.Start+1), "--to", from+","+to)
	replicas := []string{from, to}
	slices.Sort(replicas)
	assert.Equal(t, fmt.Sprintf("move %s from %s to %s", r, to, strings.Join(replicas, ",")), ch.Summary)
	assert.Equal(t, gen+2, ch.Generation)
	assert.Equal(t, []opOut{{Op: "assign", Slice: start, Replicas: replicas}}, ch.Ops)
	assert.Equal(t, replicas, e.lookup(r.Start).GetReplicas())
	st := e.status()
	assert.Equal(t, posOut{st.GetPosition().GetTerm(), st.GetPosition().GetSeq()}, ch.Position)

	// Where it is already: nothing changes.
	out = e.ok("move", start, "--to", to+","+from)
	assert.Contains(t, out, "is already held by")
	assert.Contains(t, out, fmt.Sprintf("nothing changed: the map stays at generation %d", gen+2))
	e.ok("move", start, "--to", from) // back

	// Refusals change nothing and say why.
	gen = e.status().GetGeneration()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"move", start, "--to", "nope"}, "refused: unknown node: nope is not registered"},
		{[]string{"move", keyspace.FormatPoint(r.Start + 1), "--to", to}, "refused: invalid request: no slice starts at " + keyspace.FormatPoint(r.Start+1)},
		{[]string{"move", start, "--to", to + "," + to}, "refused: invalid request: node " + to + " is listed twice"},
	} {
		out, _, err := e.ctl(c.args...)
		require.Error(t, err, c.args)
		assert.ErrorIs(t, err, ErrRefused)
		assert.NotErrorIs(t, err, ErrUsage)
		assert.Contains(t, err.Error(), c.want)
		assert.Empty(t, out)
	}
	assert.Equal(t, gen, e.status().GetGeneration(), "a refused move changes nothing")
	assert.Equal(t, []string{from}, e.lookup(r.Start).GetReplicas())
}

func ctlSplitAndMerge(t *testing.T, e *assignerEnv) {
	node, _ := e.busiest()
	r := e.sliceOn(node)
	mid, _ := r.Midpoint()
	before := e.status()

	out := e.ok("split", keyspace.FormatPoint(r.Start))
	assert.Contains(t, out, fmt.Sprintf("split %s at %s\n", r, keyspace.FormatPoint(mid)))
	assert.Contains(t, out, fmt.Sprintf("    split the slice at %s at %s\n", keyspace.FormatPoint(r.Start), keyspace.FormatPoint(mid)))
	st := e.status()
	assert.Equal(t, before.GetSlices()+1, st.GetSlices())
	assert.Equal(t, before.GetGeneration()+1, st.GetGeneration())
	assert.Equal(t, mid, e.lookup(mid).GetSlice().GetStart())
	assert.Equal(t, r.Start, e.lookup(r.Start).GetSlice().GetStart())

	// Merge the halves back, naming them by hash and by start.
	var ch changeOut
	e.okJSON(&ch, "merge", "hash:"+keyspace.FormatPoint(r.Start), keyspace.FormatPoint(mid))
	assert.Equal(t, []opOut{{Op: "merge", Left: keyspace.FormatPoint(r.Start)}}, ch.Ops)
	assert.Equal(t, before.GetSlices(), e.status().GetSlices())
	assert.Equal(t, formatRange(r), formatRange(rangeOf(e.lookup(mid).GetSlice())))

	// Split at a key: without SLICE, the slice holding it.
	h := keyspace.Hash([]byte("user:9"))
	e.okJSON(&ch, "split", "--at", "user:9")
	require.Len(t, ch.Ops, 1)
	assert.Equal(t, "split", ch.Ops[0].Op)
	assert.Equal(t, keyspace.FormatPoint(h), ch.Ops[0].At)
	assert.Equal(t, h, e.lookup(h).GetSlice().GetStart())

	// Refusals.
	gen := e.status().GetGeneration()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"merge", keyspace.FormatPoint(r.Start), "hash:0xffffffffffffffff"}, "refused: not possible now: "},
		{[]string{"split", keyspace.FormatPoint(r.Start), "--at-hash", keyspace.FormatPoint(r.Start)}, "refused: invalid request: keyspace: split point"},
	} {
		_, _, err := e.ctl(c.args...)
		require.ErrorIs(t, err, ErrRefused, c.args)
		assert.Contains(t, err.Error(), c.want)
	}
	assert.Equal(t, gen, e.status().GetGeneration())
}

func ctlPinAndUnpin(t *testing.T, e *assignerEnv) {
	h := keyspace.Hash([]byte("user:5"))
	r := rangeOf(e.lookup(h).GetSlice())
	var got struct {
		Summary string
		Range   rangeOut
		Pinned  bool
	}
	e.okJSON(&got, "pin", "key:user:5")
	assert.True(t, got.Pinned)
	assert.Equal(t, formatRange(r), got.Range)
	st := e.status()
	require.Len(t, st.GetPinned(), 1)
	assert.Equal(t, r, rangeOf(st.GetPinned()[0]))
	assert.Regexp(t, `(?m)^pinned\s+`+regexpQuote(r.String())+`$`, e.ok("status"))
	var sl struct {
		Slices []struct {
			Start  string
			Pinned bool
		}
	}
	e.okJSON(&sl, "slices")
	for _, s := range sl.Slices {
		assert.Equal(t, s.Start == keyspace.FormatPoint(r.Start), s.Pinned, s.Start)
	}

	assert.Equal(t, fmt.Sprintf("unpinned %s: balancing passes may move it again\n", r), e.ok("unpin", keyspace.FormatPoint(r.Start)))
	assert.Empty(t, e.status().GetPinned())
	// Both are idempotent: each says nothing changed, and nothing does.
	assert.Equal(t, fmt.Sprintf("%s is not pinned: nothing changed\n", r), e.ok("unpin", keyspace.FormatPoint(r.Start)))
	e.ok("pin", "key:user:5")
	var again struct{ Changed bool }
	e.okJSON(&again, "pin", "key:user:5")
	assert.False(t, again.Changed)
	assert.Equal(t, fmt.Sprintf("%s is already pinned: nothing changed\n", r), e.ok("pin", "key:user:5"))
	assert.Len(t, e.status().GetPinned(), 1)
	e.ok("unpin", keyspace.FormatPoint(r.Start))
	assert.Empty(t, e.status().GetPinned())
}

// ctlUnquarantine lifts what is not quarantined: it says so and changes nothing (the
// assigner's tests quarantine ranges; here no node crashes).
func ctlUnquarantine(t *testing.T, e *assignerEnv) {
	r := rangeOf(e.lookup(keyspace.Hash([]byte("user:5"))).GetSlice())
	assert.Equal(t, fmt.Sprintf("%s is not quarantined: nothing changed\n", r), e.ok("unquarantine", "key:user:5"))
	var got struct {
		Range   rangeOut
		Changed bool
	}
	e.okJSON(&got, "unquarantine", keyspace.FormatPoint(r.Start))
	assert.False(t, got.Changed)
	assert.Equal(t, formatRange(r), got.Range)
	assert.Empty(t, e.status().GetQuarantined())
}

func ctlFreezeAndUnfreeze(t *testing.T, e *assignerEnv) {
	assert.Equal(t, "balancing resumed\n", e.ok("unfreeze"))
	assert.False(t, e.status().GetFrozen())
	var got struct {
		Summary   string
		Frozen    bool
		WasFrozen bool `json:"was_frozen"`
		Reason    string
	}
	e.okJSON(&got, "freeze", "--reason", "maintenance")
	assert.Equal(t, "balancing frozen: maintenance", got.Summary)
	assert.True(t, got.Frozen)
	assert.False(t, got.WasFrozen)
	assert.True(t, e.status().GetFrozen())
	assert.Equal(t, "balancing frozen (it was frozen already)\n", e.ok("freeze"))
}

func ctlAlgorithm(t *testing.T, e *assignerEnv) {
	out := e.ok("algorithm", "set", "weighted-move", "--param", "max_churn=0.05", "--param", "dead_band=0.2")
	assert.Equal(t, "algorithm weighted-move dead_band=0.2 max_churn=0.05 (was weighted-move (default constants))\n", out)
	assert.Equal(t, map[string]string{"max_churn": "0.05", "dead_band": "0.2"}, e.status().GetParams())

	var show struct {
		Algorithm string
		Params    map[string]string
		Constants []struct {
			Name, Value, Default string
			Set                  bool
		}
	}
	e.okJSON(&show, "algorithm", "show")
	assert.Equal(t, "weighted-move", show.Algorithm)
	assert.Equal(t, map[string]string{"max_churn": "0.05", "dead_band": "0.2"}, show.Params)
	seen := 0
	for _, c := range show.Constants {
		switch c.Name {
		case "max_churn":
			assert.Equal(t, "0.05", c.Value)
			assert.True(t, c.Set)
			seen++
		case "min_slices_per_node":
			assert.Equal(t, c.Default, c.Value)
			assert.False(t, c.Set)
			seen++
		}
	}
	assert.Equal(t, 2, seen, "%+v", show.Constants)
	assert.Regexp(t, `(?m)^max_churn\s+0\.05\s+\S+\s+set\s+`, e.ok("algorithm", "show"))

	e.ok("algorithm", "set", "weighted-move", "--keep-params", "--param", "max_churn=0.02")
	assert.Equal(t, map[string]string{"max_churn": "0.02", "dead_band": "0.2"}, e.status().GetParams())

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"algorithm", "set", "weighted-move", "--param", "bogus=1"}, `refused: invalid request: balance: bad parameter: weighted-move has no parameter "bogus"`},
		{[]string{"algorithm", "set", "nope"}, "refused: invalid request: balance: unknown algorithm"},
	} {
		_, _, err := e.ctl(c.args...)
		require.ErrorIs(t, err, ErrRefused, c.args)
		assert.Contains(t, err.Error(), c.want)
	}
	st := e.status()
	assert.Equal(t, "weighted-move", st.GetAlgorithm(), "a refusal changes nothing")
	assert.Equal(t, map[string]string{"max_churn": "0.02", "dead_band": "0.2"}, st.GetParams())

	e.ok("algorithm", "set", "weighted-move")
	assert.Empty(t, e.status().GetParams())
}

func ctlQuantaFollow(t *testing.T, e *assignerEnv) {
	out := &logtest.Buffer{}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Execute(ctx, []string{"--assigner", e.addr, "quanta", "--follow", "--limit", "1", "-o", "json"}, out, &logtest.Buffer{})
	}()
	waitFor(t, 10*time.Second, "the history's last quantum", func() bool { return strings.Count(out.String(), "\n") >= 1 })
	listed := quantaLines(t, out.String())
	require.Len(t, listed, 1)

	h := keyspace.Hash([]byte("follow"))
	_, err := e.admin.Split(e.ctx(), &pb.SplitRequest{At: &pb.SplitRequest_AtHash{AtHash: h}}, grpc.WaitForReady(true))
	require.NoError(t, err)
	// (The last quantum listed may be a split too: wait for the line after it.)
	waitFor(t, 10*time.Second, "the split's quantum", func() bool { return strings.Count(out.String(), "\n") >= 2 })
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err, "interrupting --follow is how it ends")
	case <-time.After(10 * time.Second):
		t.Fatal("quanta --follow did not stop when its context ended")
	}
	got := quantaLines(t, out.String())
	require.Len(t, got, 2, out.String())
	q := got[1]
	assert.Equal(t, listed[0].Position.Term, q.Position.Term)
	assert.Greater(t, q.Position.Seq, listed[0].Position.Seq)
	assert.True(t, strings.HasPrefix(q.Cause, "admin: split"), q.Cause)
	require.Len(t, q.Ops, 1)
	assert.Equal(t, opOut{Op: "split", Slice: q.Ops[0].Slice, At: keyspace.FormatPoint(h)}, q.Ops[0])
	assert.Equal(t, e.status().GetGeneration(), q.Generation)
}

func ctlCompletionOfNodeIDs(t *testing.T, e *assignerEnv) {
	out := e.ok("__complete", "drain", "")
	for _, id := range envNodes {
		assert.Contains(t, out, id+"\n")
	}
	assert.Contains(t, out, ":4\n", "no file completion")
}

func ctlDrain(t *testing.T, e *assignerEnv) {
	node, _ := e.busiest()
	held := e.nodes()[node].GetSlices()
	require.NotZero(t, held)

	out, _, err := e.ctl("drain", "nope")
	require.ErrorIs(t, err, ErrRefused)
	assert.Equal(t, "refused: unknown node: nope is not registered", err.Error())
	assert.Empty(t, out)

	// While balancing is frozen, nothing moves: drain says so, and gives up waiting.
	start := time.Now()
	out, errOut, err := e.ctl("drain", node, "--wait-timeout", "300ms")
	require.Error(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, fmt.Sprintf("%s still holds %d slices after --wait-timeout 300ms; the drain goes on (slicectl nodes shows it)", node, held), err.Error())
	assert.Contains(t, errOut, "slicectl: balancing is frozen: the drain of "+node+" makes no progress until slicectl unfreeze\n")
	assert.Empty(t, out)
	assert.True(t, e.nodes()[node].GetDraining())
	assert.Equal(t, held, e.nodes()[node].GetSlices())

	// A drain that waits: it shows its progress on stderr, and returns once passes (resumed
	// while it waits) have moved every slice off the node.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stdout, stderr := &logtest.Buffer{}, &logtest.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- Execute(ctx, []string{"--assigner", e.addr, "drain", node, "-o", "json"}, stdout, stderr)
	}()
	waitFor(t, 10*time.Second, "drain waiting", func() bool {
		return strings.Contains(stderr.String(), fmt.Sprintf("draining %s: %d slices to move\n", node, held))
	})
	assert.Empty(t, stdout.String(), "still waiting")
	e.ok("unfreeze") // passes move the slices off
	select {
	case err := <-done:
		require.NoError(t, err, stderr.String())
	case <-ctx.Done():
		t.Fatalf("drain did not return: %s", stderr.String())
	}
	var got struct {
		Node              string
		Draining, Drained bool
		Slices            uint32
	}
	require.NoError(t, json.Unmarshal([]byte(stdout.String()), &got), stdout.String())
	assert.Equal(t, node, got.Node)
	assert.True(t, got.Draining)
	assert.True(t, got.Drained)
	assert.Zero(t, got.Slices)
	assert.Contains(t, stderr.String(), fmt.Sprintf("%d of %d slices moved, 0 left\n", held, held))
	ni := e.nodes()[node]
	assert.Zero(t, ni.GetSlices(), "the node holds nothing once drain returns")
	assert.True(t, ni.GetDraining())
	var total uint32
	for _, n := range e.nodes() {
		total += n.GetSlices()
	}
	assert.Equal(t, e.status().GetSlices(), total, "every slice has a home")

	// Again: already draining, and empty.
	assert.Equal(t, node+" is drained: it holds no slice and may leave\n", e.ok("drain", node))

	assert.Equal(t, fmt.Sprintf("stopped draining %s: it holds 0 slices and may take more\n", node), e.ok("drain", node, "--cancel"))
	assert.False(t, e.nodes()[node].GetDraining())
	_, _, err = e.ctl("drain", node, "--cancel")
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "is not draining")

	drainWithoutWaiting(t, e, node)
}

// drainWithoutWaiting checks that --no-wait returns with the drain under way, on a node other
// than the one drained already.
func drainWithoutWaiting(t *testing.T, e *assignerEnv, node string) {
	other := envNodes[0]
	if other == node {
		other = envNodes[1]
	}
	out := e.ok("drain", other, "--no-wait")
	assert.Regexp(t, `^draining `+other+`: it holds \d+ slices, which balancing passes move off\n$`, out)
	assert.True(t, e.nodes()[other].GetDraining())
	e.ok("drain", other, "--cancel")
	assert.False(t, e.nodes()[other].GetDraining())
}

func ctlStandby(t *testing.T, e *assignerEnv) {
	// Every assigner is active: one that owned the default target (target.Rank) would take it
	// over within a second. This one stands by.
	e.standbyAt = clustertest.StandbyAddress(t, e.c.Assigners()...)
	standby := e.c.StartAssigner().Addr
	require.Equal(t, e.standbyAt, standby)
	var st statusOut
	e.okJSON(&st, "--assigner", standby+","+e.addr, "status")
	assert.True(t, st.Leader)
	assert.Equal(t, e.addr, st.LeaderAddress, "the leader answers, wherever it is in the list")

	start := time.Now()
	_, _, err := run(t, "--assigner", standby, "--timeout", "500ms", "status")
	require.ErrorIs(t, err, ErrUnreachable)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Contains(t, err.Error(), "assigner "+standby+" unreachable as the leader: it answers, but does not lead (gave up after --timeout 500ms)")
	assert.Contains(t, err.Error(), standby+" says the leader is at "+e.addr)
}

// quantaLines decodes the JSON Lines of quanta.
type quantumOut struct {
	Position       posOut
	Clock          uint64
	Generation     uint64
	Cause          string
	By             string
	Time           *time.Time
	Reinitializing bool
	Ops            []opOut
}

func quantaLines(t *testing.T, out string) []quantumOut {
	t.Helper()
	var qs []quantumOut
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var q quantumOut
		require.NoError(t, dec.Decode(&q), out)
		qs = append(qs, q)
	}
	return qs
}

func regexpQuote(s string) string {
	r := strings.NewReplacer(`[`, `\[`, `]`, `\]`, `(`, `\(`, `)`, `\)`, `.`, `\.`)
	return r.Replace(s)
}

// deadAddress returns a loopback address where nothing listens.
func deadAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

func TestUnreachableAssignerFailsWithinTheTimeout(t *testing.T) {
	dead, dead2 := deadAddress(t), deadAddress(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--assigner", dead, "status"}, "assigner " + dead + " unreachable: dial tcp " + dead + ": connect: connection refused (gave up after --timeout 300ms)"},
		{[]string{"--assigner", dead, "move", "key:a", "--to", "n1"}, "assigner " + dead + " unreachable: "},
		{[]string{"--assigner", dead, "quanta", "--follow"}, "assigner " + dead + " unreachable: "},
		{[]string{"--assigner", dead, "drain", "n1"}, "assigner " + dead + " unreachable: "},
		{[]string{"--assigner", dead + "," + dead2, "nodes"}, "assigners " + dead + "," + dead2 + " unreachable: "},
	} {
		t.Run(strings.Join(c.args[2:], " "), func(t *testing.T) {
			start := time.Now()
			out, errOut, err := run(t, append(c.args, "--timeout", "300ms")...)
			require.Error(t, err)
			assert.Less(t, time.Since(start), 3*time.Second, "--timeout bounds the command")
			assert.ErrorIs(t, err, ErrUnreachable)
			assert.NotErrorIs(t, err, ErrUsage)
			assert.Contains(t, err.Error(), c.want)
			assert.NotContains(t, err.Error(), "rpc error", "not a raw gRPC status")
			assert.Empty(t, out)
			assert.Empty(t, errOut)
		})
	}
}

func TestBadInputIsAUsageErrorAndConnectsToNothing(t *testing.T) {
	dead := deadAddress(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"move", "foo", "--to", "n1"}, `SLICE "foo": want a slice's start (0x-prefixed hex or decimal), key:TEXT or hash:POINT`},
		{[]string{"move", "0xzz", "--to", "n1"}, `SLICE "0xzz": want a slice's start`},
		{[]string{"move", "-5", "--to", "n1"}, `unknown shorthand flag: '5'`},
		{[]string{"move", "key:", "--to", "n1"}, `SLICE "key:": the key is empty`},
		{[]string{"move", "hash:zz", "--to", "n1"}, `SLICE "hash:zz": the hash: keyspace: not a point`},
		{[]string{"move", "0x10"}, "missing --to"},
		{[]string{"move", "0x10", "--to", ","}, "a node ID is empty"},
		{[]string{"move", "--to", "n1"}, "missing SLICE"},
		{[]string{"move", "0x10", "0x20", "--to", "n1"}, `unexpected argument "0x20"`},
		{[]string{"split"}, "missing SLICE: give the slice to split, or --at KEY"},
		{[]string{"split", "nope"}, `SLICE "nope"`},
		{[]string{"split", "0x10", "--at", "a", "--at-hash", "0x11"}, "--at and --at-hash: give one or the other"},
		{[]string{"split", "0x10", "--at-hash", "x"}, "--at-hash: keyspace: not a point"},
		{[]string{"merge", "0x10"}, "missing RIGHT"},
		{[]string{"merge", "0x10", "hash:"}, `SLICE "hash:"`},
		{[]string{"pin", "key:"}, "the key is empty"},
		{[]string{"unpin"}, "missing SLICE"},
		{[]string{"lookup"}, "missing KEY: give a key or --hash"},
		{[]string{"lookup", "k", "--hash", "0x1"}, `KEY "k" and --hash 0x1: give one or the other`},
		{[]string{"lookup", "--hash", "nope"}, "--hash: keyspace: not a point"},
		{[]string{"slices", "--sort", "size"}, `--sort "size": want key or load`},
		{[]string{"slices", "--limit", "-1"}, "--limit -1"},
		{[]string{"quanta", "--limit", "-1"}, "--limit -1"},
		{[]string{"status", "-o", "xml"}, `--output "xml": want table, json or yaml`},
		{[]string{"status", "--timeout", "0s"}, "--timeout 0s: want a positive duration"},
		{[]string{"status", "extra"}, `unknown command "extra" for "slicectl status"`},
		{[]string{"drain"}, "missing NODE"},
		{[]string{"drain", "n1", "--cancel", "--no-wait"}, "--cancel does not wait"},
		{[]string{"drain", "n1", "--wait-timeout", "-1s"}, "--wait-timeout -1s"},
		{[]string{"algorithm", "set"}, "missing NAME"},
		{[]string{"algorithm", "set", "weighted-move", "--param", "max_churn"}, `--param: balance: bad parameter: "max_churn" is not name=value`},
		{[]string{"algorithm", "bogus"}, `unknown command "bogus" for "slicectl algorithm"`},
		{[]string{"freeze", "now"}, `unknown command "now" for "slicectl freeze"`},
		{[]string{"nodes", "--bogus"}, "unknown flag: --bogus"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			start := time.Now()
			out, _, err := run(t, append([]string{"--assigner", dead}, c.args...)...)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrUsage)
			assert.Contains(t, err.Error(), c.want)
			assert.Empty(t, out)
			assert.Less(t, time.Since(start), time.Second, "a usage error is found before connecting")
		})
	}
	_, _, err := run(t, "--assigner", "", "status")
	require.ErrorIs(t, err, ErrUsage)
	assert.Contains(t, err.Error(), "--assigner is empty")
}

func TestCompletionScripts(t *testing.T) {
	for shell, want := range map[string]string{
		"bash": "# bash completion V2 for slicectl", "zsh": "#compdef slicectl",
		"fish": "complete -c slicectl", "powershell": "Register-ArgumentCompleter",
	} {
		out, _, err := run(t, "completion", shell)
		require.NoError(t, err, shell)
		assert.Contains(t, out, want, shell)
	}
	// Static completions: the algorithms, the output formats, subcommands.
	out, _, err := run(t, "__complete", "algorithm", "set", "")
	require.NoError(t, err)
	assert.Contains(t, out, "weighted-move\n")
	out, _, err = run(t, "__complete", "status", "-o", "")
	require.NoError(t, err)
	assert.Contains(t, out, "table\njson\nyaml\n")
	out, _, err = run(t, "__complete", "dr")
	require.NoError(t, err)
	assert.Contains(t, out, "drain\t")
}

func TestEveryCommandHasHelpAndExamples(t *testing.T) {
	root := NewRootCommand(&bytes.Buffer{}, &bytes.Buffer{})
	var paths [][]string
	var visit func(path []string, c *cobra.Command)
	visit = func(path []string, c *cobra.Command) {
		if c.Hidden || strings.HasPrefix(c.Name(), "__") {
			return
		}
		assert.NotEmpty(t, c.Long, "%s has a Long description", c.CommandPath())
		assert.NotEmpty(t, c.Example, "%s has examples", c.CommandPath())
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			visit(append(slices.Clone(path), sub.Name()), sub)
		}
	}
	visit(nil, root)
	assert.Greater(t, len(paths), 20)
	for _, p := range paths {
		out, _, err := run(t, append(p, "--help")...)
		require.NoError(t, err, p)
		assert.Contains(t, out, "Examples:", p)
		assert.Contains(t, out, "--assigner", p)
	}
	out, _, err := run(t, "--help")
	require.NoError(t, err)
	assert.NotContains(t, out, "come later")
	for _, s := range []string{"Inspect a running assigner:", "Override the assignment:", "key:TEXT", "hash:0x"} {
		assert.Contains(t, out, s)
	}
}

func TestUserMetadataKeyMatchesTheAssigner(t *testing.T) {
	assert.Equal(t, assigner.UserMetadata, userMetadata)
}

func TestSimTakesTheGlobalOutputFlag(t *testing.T) {
	out, _, err := run(t, "sim", "--keys", "1000", "--nodes", "3", "--epochs", "2", "-o", "json")
	require.NoError(t, err)
	var r report
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.Len(t, r.Runs, 1)
	_, _, err = run(t, "sim", "--format", "csv", "-o", "json")
	require.ErrorIs(t, err, ErrUsage)
	assert.Contains(t, err.Error(), `--format "csv" and --output "json": give one or the other`)
}
