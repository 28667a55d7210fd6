package distributor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

// genSource is a source of n items with values of size bytes, made up as they are read: a
// snapshot of it is in the distributor's memory only if the distributor keeps it there.
type genSource struct {
	keys   [][]byte // sorted by hash
	hashes []uint64
	size   int
}

func newGenSource(n, size int) *genSource {
	s := &genSource{size: size}
	for i := range n {
		s.keys = append(s.keys, fmt.Appendf(nil, "item-%07d", i))
	}
	sort.Slice(s.keys, func(i, j int) bool { return keyspace.Hash(s.keys[i]) < keyspace.Hash(s.keys[j]) })
	for _, k := range s.keys {
		s.hashes = append(s.hashes, keyspace.Hash(k))
	}
	return s
}

func (s *genSource) Clock(context.Context) (uint64, error) { return 1, nil }
func (s *genSource) Progress(context.Context) error        { return nil }
func (s *genSource) Watch(ctx context.Context, _ uint64) <-chan source.Batch {
	out := make(chan source.Batch)
	go func() { <-ctx.Done(); close(out) }()
	return out
}

func (s *genSource) Scan(ctx context.Context, r keyspace.Range, at uint64, fn func(source.Item) error) (uint64, error) {
	i, _ := slices.BinarySearch(s.hashes, r.Start)
	for ; i < len(s.keys) && r.Contains(s.hashes[i]); i++ {
		v := make([]byte, s.size) // as a value read from the network is
		v[0] = byte(i)
		if err := fn(source.Item{Key: s.keys[i], Hash: s.hashes[i], Value: v, Exists: true}); err != nil {
			return 0, err
		}
	}
	return at, ctx.Err()
}

// snapshotRig is a router serving one node that holds the whole key space, attached and
// waiting for its snapshot, and a node that takes its stream as a Pull handler sends it.
type snapshotRig struct {
	r    *applier
	att  Attached
	gate chan struct{} // the node takes nothing until it is closed
	took chan int      // the items the node took, once it took them all
}

func newSnapshotRig(t testing.TB, items int) *snapshotRig {
	t.Helper()
	a, err := assignment.Uniform(1, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	r := newApplier(NewRouter(RouterConfig{ID: "d1"}))
	require.NoError(t, r.quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 1}, Clock: 1, Snapshot: a,
		Distributors: quantum.Distributors{"d1": "addr"}}))
	att, err := r.attach("a", 0, 0)
	require.NoError(t, err)
	rig := &snapshotRig{r: r, att: att, gate: make(chan struct{}), took: make(chan int, 1)}
	go rig.node(items + 3) // reset, slice list, add slice, then the items
	return rig
}

// node takes deltas and acknowledges each at once, until it took want ops.
func (rig *snapshotRig) node(want int) {
	<-rig.gate
	next, items := rig.att.Index, 0
	for int(next) < want {
		ops, _, wake, st := rig.att.q.take(rig.att.Stream, rig.att.Epoch, next, 1024, 1<<20, rig.r.clock.Load())
		if st != takeOK {
			panic(fmt.Sprintf("take: %d", st))
		}
		if len(ops) == 0 {
			<-wake
			continue
		}
		_ = appendDelta(nil, rig.att.Epoch, next, next+uint64(len(ops)), 0, 0, ops, nil)
		for _, o := range ops {
			if o.scanned && len(o.data) > 100 {
				items++
			}
		}
		next += uint64(len(ops))
		rig.att.q.ack(rig.att.Epoch, next, time.Time{}, nil)
	}
	rig.took <- items
}

// stream runs the rig's scans through a scanner, as the distributor's loop does, until the
// node took everything; pause, if set, is called once the scan first waits for the node.
func (rig *snapshotRig) stream(t testing.TB, src source.Source, pause func(*scanner)) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	sc := newScanner(src, rig.r, 4, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()))
	sc.add(rig.r.takeScans())
	sc.dispatch(ctx, &wg)
	for {
		select {
		case p := <-sc.pieces:
			sc.finish(p)
		case <-rig.r.Acked():
		case n := <-rig.took:
			return n
		}
		sc.add(rig.r.takeScans())
		sc.dispatch(ctx, &wg)
		if pause != nil && sc.reading == 0 && len(sc.waiting) > 0 {
			pause(sc)
			pause = nil
		}
	}
}

// whole runs the rig's scans as the distributor did before scans were streamed: every item
// read, then handed over at once.
func (rig *snapshotRig) whole(t testing.TB, src source.Source) int {
	t.Helper()
	close(rig.gate)
	for _, req := range rig.r.takeScans() {
		var items []op
		_, err := src.Scan(context.Background(), req.Range, req.Clock, func(it source.Item) error {
			items = encodeItem(it, items)
			return nil
		})
		require.NoError(t, err)
		rig.r.scanDone(req.ID, items, 0, nil)
	}
	return <-rig.took
}

func TestSnapshotIsReadAsTheNodeTakesIt(t *testing.T) {
	const items = 50_000
	rig := newSnapshotRig(t, items)
	src := newGenSource(items, 1024)
	var held int
	n := rig.stream(t, src, func(sc *scanner) {
		// The node took nothing yet: the scan waits for it with a bounded part read.
		_, held = rig.att.q.depth()
		close(rig.gate)
	})
	assert.Equal(t, items, n, "the node got every item")
	// The last piece let in, and the one read when the room ran out, each end after an item.
	assert.Less(t, held, rig.r.scanAhead+2*pieceBytes+2*(opOverhead+1100), "a paused scan holds its bound and two pieces")
	assert.Greater(t, items*1024, 4*held, "the snapshot is far larger than what was held")
	ops, bytes := rig.att.q.depth()
	assert.Zero(t, ops)
	assert.Zero(t, bytes)
}

// BenchmarkSnapshotHeap measures the distributor's peak heap while it sends one node a
// snapshot of 200k items of 1 KiB, read whole (as before scans were streamed) or streamed:
//
//	go test ./internal/distributor -run '^$' -bench SnapshotHeap -benchtime 1x
func BenchmarkSnapshotHeap(b *testing.B) {
	const items, size = 200_000, 1024
	src := newGenSource(items, size)
	for _, mode := range []string{"whole", "streamed"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				rig := newSnapshotRig(b, items)
				peak := watchHeap()
				start := time.Now()
				var n int
				if mode == "whole" {
					n = rig.whole(b, src)
				} else {
					close(rig.gate)
					n = rig.stream(b, src, nil)
				}
				elapsed := time.Since(start)
				alloc, live := peak()
				if n != items {
					b.Fatalf("the node took %d items, want %d", n, items)
				}
				b.ReportMetric(float64(alloc)/(1<<20), "peak-heap-MB")
				b.ReportMetric(float64(live)/(1<<20), "peak-live-MB")
				b.ReportMetric(elapsed.Seconds(), "s/snapshot")
			}
		})
	}
}

// watchHeap samples the heap until the returned function is called, which returns the peak
// of the heap allocated and of the heap live after a GC, both above what they were at the
// start.
func watchHeap() func() (alloc, live uint64) {
	runtime.GC()
	sample := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
	rtmetrics.Read(sample)
	base := [2]uint64{sample[0].Value.Uint64(), sample[1].Value.Uint64()}
	var peak [2]uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			rtmetrics.Read(sample)
			for i := range peak {
				if v := sample[i].Value.Uint64(); v > base[i] {
					peak[i] = max(peak[i], v-base[i])
				}
			}
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	return func() (uint64, uint64) {
		close(stop)
		<-done
		return peak[0], peak[1]
	}
}
