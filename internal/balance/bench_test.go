package balance_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/load"
)

// benchInput is 1,000 nodes holding 150 slices each (150k slices) whose loads follow Zipf(s),
// with popularity scattered over the slices by a fixed permutation, and 100 keys per slice.
func benchInput(b *testing.B, nodes, perNode int, s float64) balance.Input {
	b.Helper()
	return seededInput(b, nodes, perNode, s, 1)
}

// seededInput is benchInput with the popularity permutation drawn from seed.
func seededInput(b *testing.B, nodes, perNode int, s float64, seed uint64) balance.Input {
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
	rank := rand.New(rand.NewPCG(seed, 2)).Perm(n)
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
			benchPass(b, benchInput(b, 1000, 150, s))
		})
	}
}

// zonesOf splits the nodes of in, in ID order, into zones runs of equal length, as nodes
// named after their zone would be.
func zonesOf(in balance.Input, zones int) map[assignment.NodeID]string {
	out := map[assignment.NodeID]string{}
	for i, id := range in.Nodes.IDs() {
		out[id] = fmt.Sprintf("z%d", i*zones/in.Nodes.Len())
	}
	return out
}

// BenchmarkWeightedMovePassZones is BenchmarkWeightedMovePass with the nodes in three zones.
func BenchmarkWeightedMovePassZones(b *testing.B) {
	for _, s := range []float64{0.8, 1.1} {
		b.Run(fmt.Sprintf("nodes=1000/slices=150k/zipf=%.1f/zones=3", s), func(b *testing.B) {
			in := benchInput(b, 1000, 150, s)
			in.Zones = zonesOf(in, 3)
			benchPass(b, in)
		})
	}
}

// benchPass times Weighted-Move passes over in and reports what the last one did.
func benchPass(b *testing.B, in balance.Input) {
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
}

// BenchmarkZoneSpread runs 20 passes over 30 nodes in three zones holding 40 slices each,
// with Zipf(0.8) loads scattered by each of 8 seeds, zones ignored and zones given, and
// reports the share of slices with two or more replicas that are short of zones
// (balance.ZoneDeficit > 0) after the last pass, over all seeds, and the mean imbalance
// after it. Run it once: -benchtime 1x.
func BenchmarkZoneSpread(b *testing.B) {
	for _, zoned := range []bool{false, true} {
		b.Run(fmt.Sprintf("zones-given=%v", zoned), func(b *testing.B) {
			for b.Loop() {
				multi, short, imb := 0, 0, 0.0
				for seed := range uint64(8) {
					in := seededInput(b, 30, 40, 0.8, seed)
					zones := zonesOf(in, 3)
					if zoned {
						in.Zones = zones
					}
					in, x := passes(b, in, 20)
					imb += x.ImbalanceAfter / 8
					for _, s := range in.Assignment.All() {
						if len(s.Replicas) > 1 {
							multi++
							if balance.ZoneDeficit(s.Replicas, zones, in.Nodes) > 0 {
								short++
							}
						}
					}
				}
				b.ReportMetric(float64(multi), "multi-replica-slices")
				b.ReportMetric(float64(short)/float64(max(multi, 1)), "short-of-zones-share")
				b.ReportMetric(imb, "imbalance-after")
			}
		})
	}
}

// passes runs n Weighted-Move passes from in, each on the loads and key counts of the last
// carried over to its map, and returns the last input and explanation.
func passes(b *testing.B, in balance.Input, n uint64) (balance.Input, balance.Explanation) {
	alg, err := balance.New("weighted-move", nil)
	if err != nil {
		b.Fatal(err)
	}
	var res balance.Result
	for pass := range n {
		in.Pass = pass
		if res, err = alg.Rebalance(in); err != nil {
			b.Fatal(err)
		}
		next, err := in.Assignment.Apply(res.Ops)
		if err != nil {
			b.Fatal(err)
		}
		in.Load = mustReproject(b, in.Assignment, in.Load, next)
		in.Keys = mustReproject(b, in.Assignment, in.Keys, next)
		in.Assignment, in.History = next, res.History
	}
	return in, res.Explanation
}

func mustReproject(b *testing.B, from *assignment.Assignment, xs []float64, to *assignment.Assignment) []float64 {
	out, err := load.Reproject(from, xs, to)
	if err != nil {
		b.Fatal(err)
	}
	return out
}
