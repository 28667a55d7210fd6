package balance

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestCoolOrderStaysSortedWhenSeveralNodesChange changes the loads of several nodes at once,
// as a move or a replica added to a replicated slice does, and checks that the order still
// lists the nodes by ascending utilization: the move step takes its hottest node from it.
func TestCoolOrderStaysSortedWhenSeveralNodesChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const nodes = 50
	p := &wmPass{raw: make([]float64, nodes), cap: make([]float64, nodes)}
	for n := range nodes {
		p.raw[n], p.cap[n] = rng.Float64()*100, 1+rng.Float64()
	}
	o := p.newCoolOrder()
	for range 2000 {
		changed := make([]int32, 1+rng.IntN(5))
		for i := range changed {
			changed[i] = int32(rng.IntN(nodes)) // repeats happen, as in a node listed twice
			p.raw[changed[i]] = rng.Float64() * 100
		}
		o.update(changed)
		if len(o.nodes) != nodes {
			t.Fatalf("the order holds %d nodes, want %d", len(o.nodes), nodes)
		}
		if !slices.IsSortedFunc(o.nodes, o.less) {
			t.Fatalf("after changing %v the order is not by utilization: %v", changed, o.nodes)
		}
	}
}
