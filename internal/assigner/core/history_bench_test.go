package core_test

import (
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/heatmap"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/webview"
)

// BenchmarkHistoryBesideAPass compares, in one run, the core's pass over 150k slices on 1,000
// nodes with what the web view's history adds to it: a column recorded each pass, a chunk
// encoded for etcd each Config.HistoryFlush (10 passes at the default 1 s), and a grid of a
// screen's size drawn from a full hour. Target: the history costs ≤ 5% of a pass's CPU.
func BenchmarkHistoryBesideAPass(b *testing.B) {
	c, now := core.BenchCore(b, 1000, 150)
	if _, _, err := core.Pass(c, now); err != nil {
		b.Fatal(err)
	}
	a, loads := c.Loads()
	h, err := heatmap.New(heatmap.Config{})
	if err != nil {
		b.Fatal(err)
	}
	for i := range heatmap.DefaultColumns {
		h.Record(now.Add(time.Duration(i)*time.Second), a, loads)
	}
	b.Run("pass", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := core.Pass(c, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("record", func(b *testing.B) {
		for b.Loop() {
			h.Record(now, a, loads)
		}
		b.ReportMetric(float64(h.Bytes())/(1<<20), "MiB-history")
	})
	b.Run("explain-and-events", func(b *testing.B) {
		q, after, err := core.Pass(c, now)
		if err != nil || q == nil {
			b.Fatalf("a pass with no change: %v", err)
		}
		v, err := webview.New(heatmap.Config{}, nil, "")
		if err != nil {
			b.Fatal(err)
		}
		v.Publish(quantum.Quantum{Snapshot: a}, a)
		for b.Loop() {
			v.Pass(now, assigner.ExplainToProto(c.Explain()))
			v.Publish(*q, after)
			v.Publish(quantum.Quantum{Snapshot: a}, a) // the next pass starts from the same map
		}
		b.ReportMetric(float64(len(q.Ops)), "ops/pass")
	})
	b.Run("encode-chunk", func(b *testing.B) {
		k := heatmap.ChunkOf(h.Bounds().Last) - 1
		for b.Loop() {
			data, err := h.Encode(k)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(len(data)), "bytes/chunk")
		}
	})
	b.Run("grid-1200x600", func(b *testing.B) {
		for b.Loop() {
			if _, err := h.Rasterize(heatmap.Query{W: 1200, H: 600, Range: keyspace.Full()}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
