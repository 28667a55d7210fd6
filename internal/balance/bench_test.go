package balance_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
)

// benchInput is 1,000 nodes holding 150 slices each (150k slices) whose loads follow Zipf(s),
// with popularity scattered over the slices by a fixed permutation, and 100 keys per slice.
func benchInput(b *testing.B, nodes, perNode int, s float64) balance.Input {
	b.Helper()
	ns := make([]assignment.Node, nodes)
	ids := make([]assignment.NodeID, nodes)
	for i := range ns {
		ids[i] = assignment.NodeID(fmt.Sprintf("n%04d", i))
		ns[i] = assignment.Node{ID: ids[i]}
	}
	n := nodes * perNode
	a, err := assignment.Uniform(n, func(i int) []assignment.NodeID { return ids[i%nodes : i%nodes+1] })
	if err != nil {
		b.Fatal(err)
	}
	rank := rand.New(rand.NewPCG(1, 2)).Perm(n)
	loads, keys := make([]float64, n), make([]float64, n)
	for i := range loads {
		loads[i] = math.Pow(float64(rank[i]+1), -s) * float64(n)
		keys[i] = 100
	}
	return balance.Input{Assignment: a, Nodes: assignment.MustNodeSet(ns...), Load: loads, Keys: keys}
}

// BenchmarkWeightedMovePass measures one Weighted-Move pass over 1,000 nodes x 150 slices.
// Target: <= 100 ms.
func BenchmarkWeightedMovePass(b *testing.B) {
	for _, s := range []float64{0.8, 1.1} {
		b.Run(fmt.Sprintf("nodes=1000/slices=150k/zipf=%.1f", s), func(b *testing.B) {
			in := benchInput(b, 1000, 150, s)
			alg, err := balance.New("weighted-move", nil)
			if err != nil {
				b.Fatal(err)
			}
			var res balance.Result
			b.ReportAllocs()
			for b.Loop() {
				if res, err = alg.Rebalance(in); err != nil {
					b.Fatal(err)
				}
			}
			x := res.Explanation
			b.ReportMetric(x.ImbalanceBefore, "imbalance-before")
			b.ReportMetric(x.ImbalanceAfter, "imbalance-after")
			b.ReportMetric(float64(len(res.Ops)), "ops")
		})
	}
}
