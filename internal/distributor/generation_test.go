package distributor

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// TestGenerationsAreSound plays random quanta, changes and scans, finished in any order, and
// checks every node's stream: an operation that carries generation G comes after every
// reset, add_slice, drop_slice and set_slices queued while the map was at G or before, so
// that a node that applied it has seen every slice that generation gave it. Once every scan
// is done, the stream has said slice_loaded for all it added, and holds what the map gives.
func TestGenerationsAreSound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ids := []assignment.NodeID{"n1", "n2", "n3"}
		var epochs uint64
		r := NewRouter(RouterConfig{ID: "d1", NewEpoch: func() uint64 { epochs++; return epochs }})
		a := newApplier(r)
		queued := map[*byte]uint64{} // a structural op's first byte -> the generation it was queued at
		a.trace = func(_ assignment.NodeID, acts []Action) {
			for _, act := range acts {
				if act.Kind == Enqueue && structural(act.Op) {
					queued[&act.Op.data[0]] = r.generation()
				}
			}
		}
		drawReplicas := func(label string) []assignment.NodeID {
			set := rapid.SliceOfNDistinct(rapid.SampledFrom(ids), 1, 3, rapid.ID).Draw(t, label)
			slices.Sort(set)
			return set
		}
		first, err := assignment.Uniform(8, func(int) []assignment.NodeID { return drawReplicas("first") })
		require.NoError(t, err)
		first = first.WithGeneration(1)
		seq, clock := uint64(1), uint64(1)
		require.NoError(t, a.quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: seq}, Clock: clock,
			Snapshot: first, Distributors: quantum.Distributors{"d1": "addr"}}))
		for _, id := range ids {
			_, err := a.attach(id, 0, 0)
			require.NoError(t, err)
		}
		var scans []ScanRequest
		for step := range rapid.IntRange(1, 30).Draw(t, "steps") {
			scans = append(scans, a.takeScans()...)
			switch rapid.IntRange(0, 2).Draw(t, fmt.Sprint("kind ", step)) {
			case 0: // a quantum of one to three moves
				var ops []assignment.Op
				for range rapid.IntRange(1, 3).Draw(t, "moves") {
					s := r.a.Slice(rapid.IntRange(0, r.a.Len()-1).Draw(t, "slice"))
					ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: drawReplicas("to")})
				}
				seq++
				next, err := r.a.Apply(ops)
				require.NoError(t, err)
				require.NoError(t, a.quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: seq}, Clock: clock, Ops: ops,
					Generation: next.Generation()}))
			case 1: // a change
				clock++
				a.changes(source.Batch{Clock: clock, Changes: []source.Change{{Clock: clock, Key: fmt.Appendf(nil, "k%d", step), Value: []byte("v")}}}, time.Time{})
			case 2: // a scan ends
				if len(scans) > 0 {
					i := rapid.IntRange(0, len(scans)-1).Draw(t, "scan")
					a.scanDone(scans[i].ID, []op{{data: encodeChange(source.Change{Key: []byte("item"), Value: []byte("v")}), scanned: true}}, 0, nil)
					scans = slices.Delete(scans, i, i+1)
				}
			}
		}
		for scans = append(scans, a.takeScans()...); len(scans) > 0; scans = append(scans[1:], a.takeScans()...) {
			a.scanDone(scans[0].ID, nil, 0, nil)
		}
		for _, id := range ids {
			checkStream(t, r, id, a.queues[id].ready, queued)
		}
	})
}

// structural reports whether o changes which slices a node holds.
func structural(o op) bool {
	switch o.data[0] >> 3 {
	case opReset, opAddSlice, opDropSlice, opSetSlices:
		return true
	}
	return false
}

// checkStream checks node id's whole stream, every scan done.
func checkStream(t *rapid.T, r *Router, id assignment.NodeID, stream []op, queued map[*byte]uint64) {
	for i, o := range stream {
		if o.gen == 0 {
			continue // no generation: a snapshot under way
		}
		for j := i + 1; j < len(stream); j++ {
			if g, ok := queued[&stream[j].data[0]]; ok && g <= o.gen {
				t.Fatalf("%s: op %d carries generation %d, and op %d, queued at generation %d, comes after it", id, i, o.gen, j, g)
			}
		}
	}
	var cover, loading keyspace.Set
	for _, o := range stream {
		m := decodeOp(t, o.data)
		pr := m.GetAddSlice()
		if pr == nil {
			pr = m.GetDropSlice()
		}
		if pr == nil {
			pr = m.GetSliceLoaded()
		}
		rg, _ := wire.RangeFromProto(pr)
		switch o.data[0] >> 3 {
		case opReset:
			cover, loading = keyspace.Set{}, keyspace.Set{}
		case opAddSlice:
			cover, loading = cover.Union(keyspace.NewSet(rg)), loading.Union(keyspace.NewSet(rg))
		case opDropSlice:
			cover, loading = cover.Minus(keyspace.NewSet(rg)), loading.Minus(keyspace.NewSet(rg))
		case opSliceLoaded:
			loading = loading.Minus(keyspace.NewSet(rg))
		}
	}
	if !loading.Empty() {
		t.Fatalf("%s: every scan is done, and the stream leaves %s loading", id, loading)
	}
	if want := r.nodes[id].cover; !cover.Equal(want) {
		t.Fatalf("%s: the stream holds %s, the map gives %s", id, cover, want)
	}
}

// TestRouterRefusesAQuantumThatSkipsAGeneration: a distributor that missed a change finds out
// by the generation its next quantum says, as every follower of the stream does
// (quantum.Follower), and applies nothing of it.
func TestRouterRefusesAQuantumThatSkipsAGeneration(t *testing.T) {
	whole, err := assignment.Uniform(2, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	r := NewRouter(RouterConfig{ID: "d1"})
	_, err = r.Quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 1}, Clock: 1,
		Snapshot: whole, Generation: whole.Generation(), Distributors: quantum.Distributors{"d1": "addr"}})
	require.NoError(t, err)
	ops := []assignment.Op{assignment.Assign{Slice: 0, Replicas: []assignment.NodeID{"b"}}}
	next, err := whole.Apply(ops)
	require.NoError(t, err)
	q := quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 2}, Clock: 2, Ops: ops, Generation: next.Generation() + 1}
	_, err = r.Quantum(q)
	require.ErrorContains(t, err, "leads to generation")
	assert.Equal(t, quantum.Position{Term: 1, Seq: 1}, r.Position(), "nothing of it applied")
	q.Generation = next.Generation()
	_, err = r.Quantum(q)
	require.NoError(t, err)
	assert.Equal(t, q.Position, r.Position())
}
