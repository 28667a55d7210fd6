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
