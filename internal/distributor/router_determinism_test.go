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
// nothing, then one quantum in which all of them gain slices, then a rebase and a snapshot of
// every node. The actions the router returns, scans and their IDs included, must be the same
// every run, in the same order, whatever order Go walks the router's maps in.
func TestRouterDeterministic(t *testing.T) {
	want := routerScript(t)
	for run := range 50 {
		require.Equal(t, want, routerScript(t), "run %d", run)
	}
}

// routerScript plays the sequence and returns the actions the router returned, in order.
func routerScript(t *testing.T) string {
	t.Helper()
	const nodes = 6
	var epochs uint64
	r := NewRouter(RouterConfig{ID: "d1", NewEpoch: func() uint64 { epochs++; return epochs }})
	dists := quantum.Distributors{"d1": "addr"}
	var out strings.Builder
	render := func(step string, acts []Action) {
		for _, a := range acts {
			fmt.Fprintf(&out, "%s: %s\n", step, formatAction(a))
		}
	}
	empty, err := assignment.Uniform(1, func(int) []assignment.NodeID { return []assignment.NodeID{"n0"} })
	require.NoError(t, err)
	acts, err := r.Quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 1}, Clock: 1,
		Snapshot: empty, Distributors: dists})
	require.NoError(t, err)
	render("first", acts)
	attach := func(step string) {
		for i := range nodes {
			// No queue holds its whole epoch: each node starts over with a snapshot.
			acts, err := r.Attach(assignment.NodeID(fmt.Sprintf("n%d", i+1)), false)
			require.NoError(t, err)
			render(step, acts)
		}
	}
	attach("attach")
	spread, err := assignment.Uniform(4*nodes, func(i int) []assignment.NodeID {
		return []assignment.NodeID{assignment.NodeID(fmt.Sprintf("n%d", i%nodes+1)), assignment.NodeID(fmt.Sprintf("n%d", (i+1)%nodes+1))}
	})
	require.NoError(t, err)
	acts, err = r.Quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 2}, Clock: 2,
		Snapshot: spread, Distributors: dists})
	require.NoError(t, err)
	render("spread", acts)
	render("rebase", r.Rebase(3))
	attach("snapshot")
	require.Contains(t, out.String(), "spread: scan n6: scan ")
	return out.String()
}
