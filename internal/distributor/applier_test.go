package distributor

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

// overflowRig is a router and its applier serving one node, "a", that holds the whole key
// space, attached and caught up with its snapshot, with a small bound on its queue.
func overflowRig(t *testing.T, maxQueueBytes int) (*applier, Attached) {
	t.Helper()
	whole, err := assignment.Uniform(1, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	app := newApplier(NewRouter(RouterConfig{ID: "d1", MaxQueueBytes: maxQueueBytes}))
	require.NoError(t, app.quantum(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 1}, Clock: 1,
		Snapshot: whole, Distributors: quantum.Distributors{"d1": "addr"}}))
	att, err := app.attach("a", 0, 0)
	require.NoError(t, err)
	for _, s := range app.takeScans() {
		app.scanDone(s.ID, nil, 0, nil)
	}
	return app, att
}

// putBatch returns a batch of n changes at clock, each a put of a distinct key.
func putBatch(clock uint64, n int) source.Batch {
	b := source.Batch{Clock: clock}
	for i := range n {
		key := fmt.Appendf(nil, "k%d-%d", clock, i)
		b.Changes = append(b.Changes, source.Change{Clock: clock, Hash: keyspace.Hash(key), Key: key, Value: make([]byte, 100)})
	}
	return b
}

// TestOverflowRestartsTheQueueBeforeTheClockIsPublished: a batch whose second change makes
// the node's queue outgrow its bound. The queue takes nothing more of the batch, the router
// hears of the overflow and answers with a Restart, and the batch's clock is published only
// once the queue restarted: a Pull handler that reads the new clock never takes a queue
// that misses changes up to it.
func TestOverflowRestartsTheQueueBeforeTheClockIsPublished(t *testing.T) {
	app, att := overflowRig(t, 300)
	var lists [][]Action
	var overflowed []assignment.NodeID
	app.trace = func(over assignment.NodeID, acts []Action) {
		if over != "" {
			overflowed = append(overflowed, over)
			require.Equal(t, uint64(1), app.clock.Load(), "the clock waits for the restart")
			_, _, _, st := att.q.take(att.Stream, att.Epoch, att.Index, 1000, 1<<20, app.clock.Load())
			require.Equal(t, takeOK, st, "the queue is not dropped before the router says so")
			ops, _ := att.q.depth()
			require.Equal(t, 4+2, ops, "the snapshot's 4 ops (reset, slices, add, loaded) and 2 changes: the third was not applied")
		}
		lists = append(lists, append([]Action(nil), acts...))
	}
	app.changes(putBatch(2, 3), time.Now())

	require.Equal(t, []assignment.NodeID{"a"}, overflowed)
	require.Len(t, lists, 2)
	require.Equal(t, []ActionKind{Enqueue, Enqueue, Enqueue, Publish}, kinds(lists[0]), "the router routed all three")
	require.Equal(t, []Action{{Kind: Restart, Node: "a"}}, lists[1])
	require.Equal(t, uint64(2), app.clock.Load())
	_, _, _, st := att.q.take(att.Stream, att.Epoch, att.Index, 1000, 1<<20, app.clock.Load())
	require.Equal(t, takeRestart, st, "the node starts over")
	require.Equal(t, uint64(1), app.r.Stats().Overflows)

	// Until the node attaches again, the router queues nothing for it.
	lists = nil
	app.changes(putBatch(3, 1), time.Now())
	require.Equal(t, [][]Action{{{Kind: Publish, Clock: 3}}}, lists)
	att, err := app.attach("a", att.Epoch, att.Index)
	require.NoError(t, err)
	require.False(t, att.Resumed)
	require.Equal(t, []ActionKind{Restart, Enqueue, Enqueue, Enqueue, Scan}, kinds(lists[1]), "a snapshot")
}

func kinds(acts []Action) []ActionKind {
	var out []ActionKind
	for _, a := range acts {
		out = append(out, a.Kind)
	}
	return out
}

// TestOverflowedOnceEpochEnded: an overflow the router hears of after the node's epoch
// ended (the node was dropped already) changes nothing.
func TestOverflowedOnceEpochEnded(t *testing.T) {
	app, _ := overflowRig(t, 1<<20)
	acts := app.r.Rebase(5)
	require.Equal(t, []ActionKind{Restart, Publish}, kinds(acts))
	app.apply(acts)
	require.Empty(t, app.r.Overflowed("a"))
	require.Empty(t, app.r.Overflowed("nobody"))
	require.Zero(t, app.r.Stats().Overflows)
}
