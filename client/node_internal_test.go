package client

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestApplyKeepsTheClockThroughASnapshot follows a node whose distributor restarted: the new
// one has no queue of the node's epoch, so the node takes a snapshot in a new epoch, over
// several deltas of which only the last says a clock. Until then the node's clock stays the
// last one it reached; it never goes back to 0.
func TestApplyKeepsTheClockThroughASnapshot(t *testing.T) {
	n, err := NewNode(NodeConfig{ID: "n1", Assigners: []string{"127.0.0.1:1"}, Address: "127.0.0.1:2", Store: &recordingBatch{}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	start := []Op{{Kind: OpReset}, {Kind: OpAddSlice, Range: rng(0, 100)}, {Kind: OpSetSlices, Slices: []Range{rng(0, 100)}}}
	put := func(k string) Op { return Op{Kind: OpPut, Key: []byte(k), Value: []byte("v")} }
	steps := []struct {
		what    string
		delta   Delta
		clock   uint64
		cursor  Cursor
		loading bool
	}{
		{"the first snapshot, whole in one delta", Delta{Epoch: 1, From: 0, To: 4, Clock: 50, Ops: append(start, put("a"))}, 50, Cursor{1, 4}, false},
		{"a change", Delta{Epoch: 1, From: 4, To: 5, Clock: 55, Ops: []Op{put("b")}}, 55, Cursor{1, 5}, false},
		// The distributor restarts: a snapshot in a new epoch, its scan not done yet.
		{"the new snapshot's start", Delta{Epoch: 2, From: 0, To: 3, Ops: start}, 55, Cursor{2, 3}, true},
		{"a heartbeat while the scan runs", Delta{Epoch: 2, From: 3, To: 3, Ops: []Op{}}, 55, Cursor{2, 3}, true},
		{"the scan's items, more queued behind", Delta{Epoch: 2, From: 3, To: 5, Ops: []Op{put("a"), put("b")}}, 55, Cursor{2, 5}, true},
		{"the end of the snapshot", Delta{Epoch: 2, From: 5, To: 6, Clock: 60, Ops: []Op{put("c")}}, 60, Cursor{2, 6}, false},
		// A stream that resumes behind the end of its queue catches up without a clock.
		{"a resumed stream's first delta", Delta{Epoch: 2, From: 6, To: 7, Ops: []Op{put("d")}, Slices: []Range{rng(0, 100)}}, 60, Cursor{2, 7}, false},
		{"the catch-up's end", Delta{Epoch: 2, From: 7, To: 8, Clock: 70, Ops: []Op{put("e")}}, 70, Cursor{2, 8}, false},
		{"a clock-only delta", Delta{Epoch: 2, From: 8, To: 8, Clock: 75, Ops: []Op{}}, 75, Cursor{2, 8}, false},
	}
	for _, s := range steps {
		require.NoError(t, n.apply(t.Context(), s.delta), s.what)
		assert.Equal(t, s.clock, n.Clock(), "the clock after %s", s.what)
		assert.Equal(t, s.cursor, n.Cursor(), "the cursor after %s", s.what)
		assert.Equal(t, s.loading, n.Health().Loading, "loading after %s", s.what)
		if s.loading {
			assert.True(t, n.Health().Stale, "a loading node is stale, after %s", s.what)
		}
		assert.Equal(t, []Range{rng(0, 100)}, n.Slices(), "the slices after %s", s.what)
	}
}
