package distributor

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// TestRouterDeterministic plays one sequence many times: nodes attached while they hold
// nothing, then one quantum in which all of them gain slices, then a snapshot of every node.
// The scan IDs and the order of TakeScans must be the same every run, whatever order Go
// walks the router's maps in.
func TestRouterDeterministic(t *testing.T) {
	want := routerScript(t)
	for run := range 50 {
		require.Equal(t, want, routerScript(t), "run %d", run)
	}
}

// routerScript plays the sequence and returns the scans the router asked for, in order.
func routerScript(t *testing.T) string {
	t.Helper()
	const nodes = 6
	var epochs uint64
	r := NewRouter(RouterConfig{ID: "d1", NewEpoch: func() uint64 { epochs++; return epochs }})
	dists := quantum.Distributors{"d1": "addr"}
	empty, err := assignment.Uniform(1, func(int) []assignment.NodeID { return []assignment.NodeID{"n0"} })
	require.NoError(t, err)
	require.NoError(t, r.Quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 1}, Clock: 1,
		Snapshot: empty, Distributors: dists}))
	var out strings.Builder
	render := func(step string) {
		for _, s := range r.TakeScans() {
			fmt.Fprintf(&out, "%s: scan %d for %s: %s at %d\n", step, s.ID, s.Node, s.Range, s.Clock)
		}
	}
	render("first")
	for i := range nodes {
		_, err := r.Attach(assignment.NodeID(fmt.Sprintf("n%d", i+1)), 0, 0)
		require.NoError(t, err)
	}
	render("attach")
	spread, err := assignment.Uniform(4*nodes, func(i int) []assignment.NodeID {
		return []assignment.NodeID{assignment.NodeID(fmt.Sprintf("n%d", i%nodes+1)), assignment.NodeID(fmt.Sprintf("n%d", (i+1)%nodes+1))}
	})
	require.NoError(t, err)
	require.NoError(t, r.Quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 2}, Clock: 2,
		Snapshot: spread, Distributors: dists}))
	render("spread")
	r.Rebase(3)
	for i := range nodes {
		_, err := r.Attach(assignment.NodeID(fmt.Sprintf("n%d", i+1)), 0, 0)
		require.NoError(t, err)
	}
	render("rebase")
	require.NotZero(t, out.Len())
	return out.String()
}
