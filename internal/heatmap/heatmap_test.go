package heatmap_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/assignment/assignmenttest"
	"github.com/sliceplane/sliceplane/internal/heatmap"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

var pool = []assignment.NodeID{"a", "b", "c", "d", "e"}

// TestAGridKeepsTheLoad: over the whole space, the rows' loads (density times the fraction
// they cover) add up to the map's load, whatever the map and the grid's height; and every
// row a slice covers names a holder.
func TestAGridKeepsTheLoad(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := assignmenttest.Generator(pool, 200, math.MaxUint64).Draw(t, "map")
		loads := rapid.SliceOfN(rapid.Float64Range(0, 100), a.Len(), a.Len()).Draw(t, "loads")
		cells := 1 << rapid.IntRange(0, 8).Draw(t, "cells log2")
		h, err := heatmap.New(heatmap.Config{Columns: 2, Cells: cells})
		require.NoError(t, err)
		h.Record(time.Unix(1, 0), a, loads)
		rows := rapid.IntRange(1, 300).Draw(t, "rows")
		g, err := h.Rasterize(heatmap.Query{W: 1, H: rows, Range: keyspace.Full()})
		require.NoError(t, err)
		var want, got float64
		for _, l := range loads {
			want += l
		}
		for r := range rows {
			got += g.Load[r] / float64(rows)
			require.GreaterOrEqual(t, g.Holder[r], 0, "row %d has no holder", r)
		}
		require.InDelta(t, want, got, 1e-6*math.Max(want, 1))
	})
}

// TestTheMemoryIsBounded: a full ring of the largest maps takes what CellBytes says of each
// cell, and no more as more columns come.
func TestTheMemoryIsBounded(t *testing.T) {
	ss := keyspace.Equal(4096)
	slices := make([]assignment.Slice, len(ss))
	for i, r := range ss {
		slices[i] = assignment.Slice{Range: r, Replicas: pool[i%3 : i%3+3], Primary: pool[i%3]}
	}
	a, err := assignment.New(1, slices)
	require.NoError(t, err)
	h, err := heatmap.New(heatmap.Config{Columns: 10, Cells: 256, Events: 10})
	require.NoError(t, err)
	loads := make([]float64, a.Len())
	for i := range 25 {
		h.Record(time.Unix(int64(i), 0), a, loads)
	}
	bound := 10*256*heatmap.CellBytes + 10*(96+len("drain")) + 5*(1+16+24)
	require.LessOrEqual(t, h.Bytes(), bound)
	require.GreaterOrEqual(t, h.Bytes(), 10*256*heatmap.CellBytes)
	require.Equal(t, heatmap.Bounds{First: 16, Last: 25, FirstTime: time.Unix(15, 0), LastTime: time.Unix(24, 0), Columns: 10}, h.Bounds())
}

// TestObserveDrawsTheQuantaOps: a quantum's splits, merges, moves and role changes become
// events over the ranges they changed; clock quanta none.
func TestObserveDrawsTheQuantaOps(t *testing.T) {
	half := keyspace.Equal(2)
	before, err := assignment.New(1, []assignment.Slice{{Range: half[0], Replicas: []assignment.NodeID{"a"}}, {Range: half[1], Replicas: []assignment.NodeID{"b"}}})
	require.NoError(t, err)
	ops := []assignment.Op{assignment.Assign{Slice: half[1].Start, Replicas: []assignment.NodeID{"a"}}, assignment.Merge{Left: 0}, assignment.Split{Slice: 0, At: 1 << 62}}
	h, err := heatmap.New(heatmap.Config{})
	require.NoError(t, err)
	h.Record(time.Unix(1, 0), before, nil)
	q := quantum.Quantum{Ops: ops, Cause: "admin:move", By: "spiffe://sliceplane/admin/x", Time: time.Unix(2, 0)}
	h.Observe(q, before)
	h.Observe(quantum.Quantum{Time: time.Unix(3, 0)}, before)
	evs := h.Events(0, 10, keyspace.Full(), 10)
	require.Len(t, evs, 3)
	require.Equal(t, heatmap.KindMove, evs[0].Kind)
	require.Equal(t, half[1], evs[0].Range)
	require.Equal(t, "b → a", evs[0].What)
	require.Equal(t, "spiffe://sliceplane/admin/x", evs[0].By)
	require.Equal(t, heatmap.KindMerge, evs[1].Kind)
	require.Equal(t, keyspace.Full(), evs[1].Range)
	require.Equal(t, heatmap.KindSplit, evs[2].Kind)
	require.Equal(t, uint64(1<<62), evs[2].Range.Start)
	require.Len(t, h.Events(0, 10, keyspace.Range{Start: 0, End: keyspace.At(1 << 61)}, 10), 1, "only the merge overlaps the first eighth")
}

// TestRestoreRebuildsTheHistory: the chunks a leader persisted give a new leader the same
// grid, events and cells, and numbering goes on after them; a damaged chunk changes nothing.
func TestRestoreRebuildsTheHistory(t *testing.T) {
	a := assignmenttest.Generator(pool, 50, math.MaxUint64).Example(1)
	loads := make([]float64, a.Len())
	for i := range loads {
		loads[i] = float64(i)
	}
	h, err := heatmap.New(heatmap.Config{Columns: 200, Cells: 16})
	require.NoError(t, err)
	for i := range 130 {
		h.Record(time.Unix(int64(i), 0), a, loads)
		if i == 70 {
			h.Add(heatmap.Event{At: time.Unix(70, 0), Kind: heatmap.KindDrain, Range: keyspace.Full(), What: "c"})
		}
	}
	restored, err := heatmap.New(heatmap.Config{Columns: 200, Cells: 16})
	require.NoError(t, err)
	require.Error(t, restored.Restore([]byte("not a chunk")))
	for k := heatmap.ChunkOf(1); k <= heatmap.ChunkOf(130); k++ {
		data, err := h.Encode(k)
		require.NoError(t, err)
		require.NoError(t, restored.Restore(data))
	}
	q := heatmap.Query{W: 130, H: 64, Range: keyspace.Full()}
	want, err := h.Rasterize(q)
	require.NoError(t, err)
	got, err := restored.Rasterize(q)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, h.Events(0, 200, keyspace.Full(), 10), restored.Events(0, 200, keyspace.Full(), 10))
	require.Equal(t, uint64(131), restored.Record(time.Unix(200, 0), a, loads))
	data, err := h.Encode(0)
	require.NoError(t, err)
	require.Error(t, restored.Restore(data), "a chunk older than the ring's newest column is refused")
}

// BenchmarkAFullHour measures the heap an hour of one-second columns of a 150k-slice map on
// 1,000 nodes takes (live heap after a GC, against an empty History), beside what Bytes
// counts and the bound Columns × Cells × CellBytes; the size of a persisted chunk, and the
// time to restore the hour from its chunks (not counting reading them from etcd).
func BenchmarkAFullHour(b *testing.B) {
	ss := keyspace.Equal(150_000)
	slices := make([]assignment.Slice, len(ss))
	ids := make([]assignment.NodeID, 1000)
	for i := range ids {
		ids[i] = assignment.NodeID(fmt.Sprintf("n%04d", i))
	}
	for i, r := range ss {
		slices[i] = assignment.Slice{Range: r, Replicas: []assignment.NodeID{ids[i%1000]}}
	}
	a, err := assignment.New(1, slices)
	require.NoError(b, err)
	loads := make([]float64, a.Len())
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		h, err := heatmap.New(heatmap.Config{})
		require.NoError(b, err)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range heatmap.DefaultColumns {
			for j := range loads { // every load moves a little each pass, as measured ones do
				loads[j] = 1 + rng.Float64()
			}
			h.Record(time.Unix(int64(i), 0), a, loads)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		chunk, err := h.Encode(heatmap.ChunkOf(h.Bounds().Last) - 1)
		require.NoError(b, err)
		b.ReportMetric(float64(len(chunk))/1024, "KiB/chunk")
		// What a new leader does before its first pass: decode every chunk of the hour.
		var chunks [][]byte
		for k := heatmap.ChunkOf(h.Bounds().First); k <= heatmap.ChunkOf(h.Bounds().Last); k++ {
			data, err := h.Encode(k)
			require.NoError(b, err)
			chunks = append(chunks, data)
		}
		restored, err := heatmap.New(heatmap.Config{})
		require.NoError(b, err)
		start := time.Now()
		for _, data := range chunks {
			require.NoError(b, restored.Restore(data))
		}
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms-restore")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB-heap")
		b.ReportMetric(float64(h.Bytes())/(1<<20), "MiB-counted")
		b.ReportMetric(float64(heatmap.DefaultColumns*heatmap.DefaultCells*heatmap.CellBytes)/(1<<20), "MiB-bound")
		runtime.KeepAlive(h)
	}
}

// TestAQuantumAddsBoundedEvents: a pass of thousands of changes adds MaxQuantumEvents.
func TestAQuantumAddsBoundedEvents(t *testing.T) {
	ss := keyspace.Equal(4)
	slices := make([]assignment.Slice, len(ss))
	for i, r := range ss {
		slices[i] = assignment.Slice{Range: r, Replicas: []assignment.NodeID{"a"}}
	}
	before, err := assignment.New(1, slices)
	require.NoError(t, err)
	var ops []assignment.Op
	for i := range 1000 {
		ops = append(ops, assignment.Split{Slice: 0, At: uint64(1000 - i)})
	}
	h, err := heatmap.New(heatmap.Config{})
	require.NoError(t, err)
	h.Observe(quantum.Quantum{Ops: ops, Cause: "pass"}, before)
	assert.Len(t, h.Events(0, 10, keyspace.Full(), 10_000), heatmap.MaxQuantumEvents)
}
