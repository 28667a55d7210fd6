package sim

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/sliceplane/sliceplane/internal/balance"
)

// BenchmarkSimulator runs Weighted-Move on zipf:1.1 with 100 nodes for 20 epochs. Target at
// 1M keys: <= 30 s per run, with memory proportional to keys. live-B/key is the largest live
// heap seen at an epoch boundary (after a GC) over the number of keys; comparing it across
// key counts shows whether memory grows with keys alone.
func BenchmarkSimulator(b *testing.B) {
	for _, keys := range []int{250_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d/nodes=100/epochs=20", keys), func(b *testing.B) {
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
					Nodes: 100, Epochs: 20,
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
