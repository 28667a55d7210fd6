package distributor

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

// benchRouter returns a router serving nodes nodes over a map of slices slices, every node
// attached with its snapshot done, as a distributor is once its nodes caught up.
func benchRouter(b *testing.B, nodes, slices int) (*applier, []assignment.NodeID, []Attached) {
	b.Helper()
	ids := make([]assignment.NodeID, nodes)
	for i := range ids {
		ids[i] = assignment.NodeID(fmt.Sprintf("node-%03d", i))
	}
	a, err := assignment.Uniform(slices, func(i int) []assignment.NodeID { return []assignment.NodeID{ids[i%nodes]} })
	if err != nil {
		b.Fatal(err)
	}
	r := newApplier(NewRouter(RouterConfig{ID: "d1", MaxQueueBytes: 1 << 30}))
	if err := r.quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 1}, Snapshot: a,
		Distributors: quantum.Distributors{"d1": "addr"}}); err != nil {
		b.Fatal(err)
	}
	atts := make([]Attached, nodes)
	for i, id := range ids {
		if atts[i], err = r.attach(id, 0, 0); err != nil {
			b.Fatal(err)
		}
	}
	for _, s := range r.takeScans() {
		r.scanDone(s.ID, nil, 0, nil)
	}
	return r, ids, atts
}

// change makes the i-th change of a benchmark: a put of a distinct key with a value of size
// bytes, alone at clock i+1, as an etcd source delivers single puts.
func change(i int, value []byte) source.Batch {
	key := fmt.Appendf(nil, "key-%09d", i)
	clock := uint64(i) + 1
	return source.Batch{Clock: clock, Changes: []source.Change{{Clock: clock, Hash: keyspace.Hash(key), Key: key, Value: value}}}
}

func changes(n, size int) []source.Batch {
	value := make([]byte, size)
	out := make([]source.Batch, n)
	for i := range out {
		out[i] = change(i, value)
	}
	return out
}

// consume drains a node's queue as its Pull handler does: deltas of at most 1024 ops,
// assembled into frames, acknowledged at once. It returns when the node has taken want ops.
func consume(r *applier, att Attached, want uint64, frames *int) {
	next := att.Index
	for next-att.Index < want {
		ops, clock, wake, st := att.q.take(att.Stream, att.Epoch, next, 1024, 1<<20, r.clock.Load())
		if st != takeOK {
			panic(fmt.Sprintf("take: %d", st))
		}
		if len(ops) == 0 {
			<-wake
			continue
		}
		frame := appendDelta(nil, att.Epoch, next, next+uint64(len(ops)), clock, deltaGen(ops, 0), ops, nil)
		*frames += len(frame)
		next += uint64(len(ops))
		att.q.ack(att.Epoch, next, time.Time{}, nil)
	}
}

// BenchmarkRouterThroughput measures source changes per second through one distributor's
// core (sequencer, router, per-node queues) into encoded deltas for 100 nodes, each drained
// by a consumer that assembles and acknowledges its deltas as the Pull handler does. The
// network and the source's own cost are not in it (BenchmarkBurstFill has them).
func BenchmarkRouterThroughput(b *testing.B) {
	for _, size := range []int{100} {
		b.Run(fmt.Sprintf("nodes=100/value=%dB", size), func(b *testing.B) {
			r, ids, atts := benchRouter(b, 100, 15000)
			batches := changes(b.N, size)
			per := make([]uint64, len(atts)) // changes each node gets
			index := map[assignment.NodeID]int{}
			for i, id := range ids {
				index[id] = i
			}
			for _, bt := range batches {
				_, s := r.r.a.Lookup(bt.Changes[0].Hash)
				per[index[s.Replicas[0]]]++
			}
			var wg sync.WaitGroup
			frames := make([]int, len(atts))
			b.ReportAllocs()
			b.ResetTimer()
			for i, att := range atts {
				wg.Add(1)
				go func() { defer wg.Done(); consume(r, att, per[i], &frames[i]) }()
			}
			seq := NewSequencer(0)
			for i, bt := range batches {
				seq.AddBatch(bt)
				if i%1000 == 999 || i == len(batches)-1 {
					// A clock quantum every thousand changes, as the assigner sends them, after the
					// map's (seq 1): a run of one change must not send seq 0.
					seq.AddQuantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: uint64(i) + 2}, Clock: bt.Clock})
					for {
						ev, ok := seq.Next()
						if !ok {
							break
						}
						if ev.Batch != nil {
							r.changes(*ev.Batch, time.Time{})
						} else if err := r.quantum(*ev.Quantum); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "changes/s")
		})
	}
}

// BenchmarkQueueMemory measures what a distributor holds per byte of queued deltas: 100
// nodes that do not consume, while changes of 100-byte values pile up in their queues. The
// ratio is the growth of the Go heap over the bytes of the encoded operations queued.
func BenchmarkQueueMemory(b *testing.B) {
	for range b.N {
		r, _, _ := benchRouter(b, 100, 15000)
		value := make([]byte, 100)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range 200_000 {
			r.changes(change(i, value), time.Time{})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		var deltaBytes int
		for _, q := range r.queues {
			q.mu.Lock()
			for _, o := range q.ready {
				deltaBytes += len(o.data)
			}
			q.mu.Unlock()
		}
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(deltaBytes), "heap/delta-bytes")
		b.ReportMetric(float64(deltaBytes)/float64(len(r.queues)), "delta-bytes/node")
		runtime.KeepAlive(r)
	}
}
