package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
)

// BenchmarkSimulator runs Weighted-Move on zipf:1.1 with 100 nodes for 20 epochs, measuring
// with the even split and with the least-outstanding router. Target at 1M keys: <= 30 s per
// run, with memory proportional to keys, the router adding at most a few percent. live-B/key
// is the largest live heap seen at an epoch boundary (after a GC) over the number of keys;
// comparing it across key counts shows whether memory grows with keys alone.
func BenchmarkSimulator(b *testing.B) {
	for _, bench := range []struct {
		keys   int
		router Router
	}{{250_000, RouterEven}, {1_000_000, RouterEven}, {1_000_000, RouterLeastOutstanding}} {
		keys := bench.keys
		b.Run(fmt.Sprintf("keys=%d/nodes=100/epochs=20/router=%s", keys, bench.router), func(b *testing.B) {
			var peak uint64
			var final float64
			for b.Loop() {
				alg, err := balance.New("weighted-move", nil)
				if err != nil {
					b.Fatal(err)
				}
				wl, err := ParseWorkload("zipf:1.1", keys, 20, 1)
				if err != nil {
					b.Fatal(err)
				}
				var ms runtime.MemStats
				res, err := Run(context.Background(), alg, Scenario{Workload: wl}, Options{
					Nodes: 100, Epochs: 20, Router: bench.router,
					Progress: func(int, int) {
						b.StopTimer()
						runtime.GC()
						runtime.ReadMemStats(&ms)
						peak = max(peak, ms.HeapAlloc)
						b.StartTimer()
					},
				})
				if err != nil {
					b.Fatal(err)
				}
				final = res.Summary.FinalImbalance
			}
			b.ReportMetric(float64(peak)/float64(keys), "live-B/key")
			b.ReportMetric(final, "final-imbalance")
		})
	}
}

// BenchmarkSimulatorCore is BenchmarkSimulator on the assigner's core: every epoch, 100 nodes
// report and the core folds the reports and runs its pass.
func BenchmarkSimulatorCore(b *testing.B) {
	for _, keys := range []int{250_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d/nodes=100/epochs=20", keys), func(b *testing.B) {
			var final float64
			for b.Loop() {
				wl, err := ParseWorkload("zipf:1.1", keys, 20, 1)
				if err != nil {
					b.Fatal(err)
				}
				res, err := RunCore(context.Background(), "weighted-move", nil, Scenario{Workload: wl}, Options{Nodes: 100, Epochs: 20})
				if err != nil {
					b.Fatal(err)
				}
				final = res.Summary.FinalImbalance
			}
			b.ReportMetric(final, "final-imbalance")
		})
	}
}

// BenchmarkSplit measures one epoch's routing alone: 100 nodes, 100 slices each, one slice in
// ten on two to four nodes with a Zipf-like load, split by each router.
func BenchmarkSplit(b *testing.B) {
	rnd := rand.New(rand.NewPCG(1, 1))
	all := make([]assignment.Node, 100)
	for i := range all {
		all[i] = assignment.Node{ID: assignment.NodeID(fmt.Sprintf("n%03d", i)), Capacity: 1}
	}
	nodes, err := assignment.NewNodeSet(all)
	if err != nil {
		b.Fatal(err)
	}
	a, err := assignment.Uniform(10_000, func(i int) []assignment.NodeID {
		k := 1
		if i%10 == 0 {
			k = 2 + rnd.IntN(3)
		}
		out := make([]assignment.NodeID, 0, k)
		for _, j := range rnd.Perm(len(all))[:k] {
			out = append(out, all[j].ID)
		}
		return out
	})
	if err != nil {
		b.Fatal(err)
	}
	loads := make([]float64, a.Len())
	for i := range loads {
		loads[i] = 1 / float64(1+rnd.IntN(a.Len()))
	}
	for _, r := range Routers {
		b.Run(string(r), func(b *testing.B) {
			for b.Loop() {
				splitLoads(a, loads, nodes, r)
			}
		})
	}
}
