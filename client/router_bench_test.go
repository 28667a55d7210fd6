package client

import (
	"fmt"
	"testing"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// benchSlices is the size of map the assigner is built for (Slicer's largest jobs).
const benchSlices = 150_000

// benchRouter returns a router with a map of benchSlices equal slices over 100 nodes, each
// slice held by three of them, and every node's address known.
func benchRouter(b *testing.B, p Policy) *Router {
	b.Helper()
	const nodes = 100
	ids := make([]assignment.NodeID, nodes)
	known := make(map[assignment.NodeID]nodeInfo, nodes)
	for i := range ids {
		ids[i] = assignment.NodeID(fmt.Sprintf("node-%03d", i))
		known[ids[i]] = nodeInfo{address: fmt.Sprintf("10.0.%d.%d:7000", i/256, i%256), capacity: float64(1 + i%3)}
	}
	a, err := assignment.Uniform(benchSlices, func(i int) []assignment.NodeID {
		return []assignment.NodeID{ids[i%nodes], ids[(i+7)%nodes], ids[(i+31)%nodes]}
	})
	if err != nil {
		b.Fatal(err)
	}
	r, err := NewRouter(RouterConfig{Assigners: []string{"127.0.0.1:1"}, Policy: p})
	if err != nil {
		b.Fatal(err)
	}
	r.setNodes(known)
	if err := r.apply(reinit(a, 1, 1, 1)); err != nil {
		b.Fatal(err)
	}
	return r
}

// benchKeys returns keys of the form an application would use.
func benchKeys() [][]byte {
	keys := make([][]byte, 4096)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "user:%08d", i*7919)
	}
	return keys
}

func BenchmarkRouterLookup(b *testing.B) {
	r := benchRouter(b, RoundRobin)
	keys := benchKeys()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := r.Lookup(keys[i%len(keys)]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRouterPick(b *testing.B) {
	keys := benchKeys()
	for _, p := range []Policy{LeastOutstanding, RoundRobin, WeightedCapacity, PowerOfTwo} {
		b.Run(p.String(), func(b *testing.B) {
			r := benchRouter(b, p)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := r.Pick(keys[i%len(keys)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// A whole request as the application makes it: pick, report the start, report the end.
	b.Run("least-outstanding+begin+done", func(b *testing.B) {
		r := benchRouter(b, LeastOutstanding)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			rep, err := r.Pick(keys[i%len(keys)])
			if err != nil {
				b.Fatal(err)
			}
			r.Begin(rep.ID)()
		}
	})
}

// BenchmarkRouterApply measures applying a quantum of one operation to the map of 150k
// slices, which copies the map and links every slice to its replicas.
func BenchmarkRouterApply(b *testing.B) {
	r := benchRouter(b, RoundRobin)
	// The first slice goes back and forth between its three replicas and two of them.
	three := r.view.Load().a.Slice(0).Replicas
	sets := [2][]assignment.NodeID{three[:2], three}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		v := r.view.Load()
		q := reinit(v.a, v.pos.Term, v.pos.Seq+1, v.clock+1)
		q.Snapshot, q.Generation = nil, v.a.Generation()+1
		q.Ops = []assignment.Op{assignment.Assign{Slice: 0, Replicas: sets[i%2]}}
		if err := r.apply(q); err != nil {
			b.Fatal(err)
		}
	}
}
