package distributor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTakenOpsOutliveATrimByANewerStream: a node's stalled stream may still be encoding the
// operations it took when the node's new stream attaches and acknowledges past them. What
// the old stream took must stay as it was: the trim used to zero the shared entries in
// place, under the old stream's feet (a data race the chaos suite's race-built run found).
func TestTakenOpsOutliveATrimByANewerStream(t *testing.T) {
	q := newQueue()
	q.restart(7)
	old := q.attachNew()
	for i := range 64 {
		q.push(op{data: []byte{byte(i)}})
	}
	ops, _, _, st := q.take(old, 7, 0, 64, 1<<20, 0)
	require.Equal(t, takeOK, st)
	require.Len(t, ops, 64)

	// The node's new stream attaches and acknowledges everything.
	_, _, _, ok := q.attach(7, 0)
	require.True(t, ok)
	q.ack(7, 64, time.Now(), nil)

	for i, o := range ops { // the old stream, still encoding
		require.Equal(t, []byte{byte(i)}, o.data, "op %d of the old stream", i)
	}
	_, _, _, st = q.take(old, 7, 64, 64, 1<<20, 0)
	require.Equal(t, takeReplaced, st, "the old stream learns it was replaced")
}

// TestAResumedStreamKnowsTheGeneration: a stream that resumes where the node stands carries
// the generation of the operation before, which a node that restarted has forgotten: that
// of the last operation the node acknowledged, or the epoch's start's.
func TestAResumedStreamKnowsTheGeneration(t *testing.T) {
	q := newQueue()
	q.restart(7)
	for _, gen := range []uint64{3, 4, 5} {
		q.push(op{data: []byte{1}, gen: gen})
	}
	_, _, gen, ok := q.attach(7, 0)
	require.True(t, ok)
	require.Zero(t, gen, "nothing before the epoch's start")
	q.ack(7, 2, time.Now(), nil)
	_, _, gen, ok = q.attach(7, 2)
	require.True(t, ok)
	require.Equal(t, uint64(4), gen, "the second operation's, the last acknowledged")
	_, _, gen, ok = q.attach(7, 3)
	require.True(t, ok)
	require.Equal(t, uint64(5), gen)
}

// TestAScanHasRoomDespiteWhatWaitsBehindIt: the scan-ahead bound counts the scanned
// operations the node can take now, not those that wait behind the running scan (a
// snapshot's add_slice of each later range, slice_loaded): those cannot leave before the scan
// ends, so counting them could keep the scan from ever reading on. A node with many ranges
// under a small bound waited for good (seen as a node stuck at a clock in the data-path
// scenarios).
func TestAScanHasRoomDespiteWhatWaitsBehindIt(t *testing.T) {
	const limit = 1 << 10
	q := newQueue()
	q.restart(1)
	q.pushScan(1)
	for range 3 * limit / opOverhead { // every later range's add_slice, and its scan
		q.push(op{data: []byte("add_slice"), scanned: true})
	}
	q.pushScan(2)
	room, stale := q.scanRoom(1, limit)
	require.False(t, stale)
	require.True(t, room, "nothing the node can take yet: the first scan reads")

	// What the scan read counts, until the node takes it.
	for !func() bool { room, _ := q.scanRoom(1, limit); return !room }() {
		require.True(t, q.fill(1, []op{{data: make([]byte, 64), scanned: true}}, false))
	}
	ops, _, _, st := q.take(q.attachNew(), 1, 0, 1<<20, 1<<30, 0)
	require.Equal(t, takeOK, st)
	q.ack(1, uint64(len(ops)), time.Now(), nil)
	room, _ = q.scanRoom(1, limit)
	require.True(t, room, "the node took what was read")

	// Once the scan ends, what waited behind it is the node's to take, and counts.
	require.True(t, q.fill(1, nil, true))
	room, _ = q.scanRoom(2, limit)
	require.False(t, room, "the next scan waits for the node to take the add_slices")
}
