package client

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadingRecorder is a store that keeps the loading ranges with its cursor.
type loadingRecorder struct {
	recordingBatch
	loading, staged []Range
	set             bool
}

func (s *loadingRecorder) Begin(context.Context) (Batch, error) {
	s.staged, s.set = nil, false
	return s, nil
}

func (s *loadingRecorder) SetLoading(rs []Range) error {
	s.staged, s.set = slices.Clone(rs), true
	return nil
}

func (s *loadingRecorder) Commit(c Cursor) error {
	if s.set {
		s.loading = s.staged
	}
	s.cursor = c
	return nil
}

func (s *loadingRecorder) Loading(context.Context) ([]Range, error) {
	return slices.Clone(s.loading), nil
}

func testNode(t *testing.T, s Store) *Node {
	t.Helper()
	n, err := NewNode(NodeConfig{ID: "n1", Assigners: []string{"127.0.0.1:1"}, Address: "127.0.0.1:2", Store: s, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, n.restore(t.Context()))
	return n
}

// keyIn returns a key whose hash lies in r.
func keyIn(t *testing.T, r Range) []byte {
	t.Helper()
	for i := range 100000 {
		k := []byte{byte(i), byte(i >> 8), byte(i >> 16)}
		if r.ContainsKey(k) {
			return k
		}
	}
	t.Fatalf("no key in %s", r)
	return nil
}

// TestNodeTracksLoading follows a node through a snapshot and a handoff: add_slice makes a
// range loading, slice_loaded, drop_slice and reset end it, the generation is that of the
// last delta with operations, and a restarted node remembers what it was loading.
func TestNodeTracksLoading(t *testing.T) {
	s := &loadingRecorder{}
	n := testNode(t, s)
	a, b, c := rng(0, 1<<62), rng(1<<62, 1<<62+1<<61), rngEnd(1<<63)
	list := []Range{a, b, c}
	steps := []struct {
		what    string
		delta   Delta
		loading []Range
		gen     uint64
	}{
		{"a snapshot begins", Delta{Epoch: 1, To: 3, Ops: []Op{{Kind: OpReset}, {Kind: OpSetSlices, Slices: []Range{a}}, {Kind: OpAddSlice, Range: a}}, Generation: 4}, []Range{a}, 4},
		{"a heartbeat says nothing of the generation", Delta{Epoch: 1, From: 3, To: 3, Ops: []Op{}, Generation: 9}, []Range{a}, 4},
		{"its items, and the slice loaded", Delta{Epoch: 1, From: 3, To: 5, Ops: []Op{{Kind: OpPut, Key: keyIn(t, a), Value: []byte("v")}, {Kind: OpSliceLoaded, Range: a}}, Generation: 4, Clock: 10}, nil, 4},
		{"two slices come in a handoff", Delta{Epoch: 1, From: 5, To: 8, Ops: []Op{{Kind: OpSetSlices, Slices: list}, {Kind: OpAddSlice, Range: b}, {Kind: OpAddSlice, Range: c}}, Generation: 5}, []Range{b, c}, 5},
		{"one is loaded", Delta{Epoch: 1, From: 8, To: 9, Ops: []Op{{Kind: OpSliceLoaded, Range: b}}, Generation: 5}, []Range{c}, 5},
	}
	for _, st := range steps {
		require.NoError(t, n.apply(t.Context(), st.delta), st.what)
		assert.Equal(t, st.loading, nilIfEmpty(n.LoadingRanges()), "loading after %s", st.what)
		assert.Equal(t, st.loading, nilIfEmpty(s.loading), "stored loading after %s", st.what)
		assert.Equal(t, st.gen, n.Generation(), "generation after %s", st.what)
	}
	assert.True(t, n.Serving(keyIn(t, a)), "a loaded slice is served")
	assert.True(t, n.Serving(keyIn(t, b)))
	assert.False(t, n.Serving(keyIn(t, c)), "a loading slice is not served")
	assert.True(t, n.Loading(Hash(keyIn(t, c))))
	assert.False(t, n.Loading(Hash(keyIn(t, a))))

	// The node restarts: it still loads c, and knows no generation until its stream resumes.
	n = testNode(t, s)
	assert.Equal(t, []Range{c}, n.LoadingRanges(), "a restarted node remembers what it loads")
	assert.Equal(t, Cursor{1, 9}, n.Cursor())
	assert.Zero(t, n.Generation())
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 1, From: 9, To: 9, Ops: []Op{}, Slices: list, Generation: 5}))
	assert.Equal(t, uint64(5), n.Generation(), "a resumed stream says where the node stands")
	assert.True(t, n.Loading(Hash(keyIn(t, c))))

	// A dropped slice is loaded no more; a reset ends all loading.
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 1, From: 9, To: 11, Ops: []Op{{Kind: OpAddSlice, Range: rng(1<<62, 1<<62+10)}, {Kind: OpDropSlice, Range: c}}, Generation: 6}))
	assert.Equal(t, []Range{rng(1<<62, 1<<62+10)}, n.LoadingRanges())
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 2, To: 1, Ops: []Op{{Kind: OpReset}}}))
	assert.Empty(t, n.LoadingRanges())
	assert.Empty(t, s.loading)
	assert.Zero(t, n.Generation(), "a snapshot under way has no generation")
}

// TestANodeServesNoSliceItListsBeforeItAddsIt: the slice list and the add_slice of a gained
// slice can come in two deltas; in between the node lists a slice it holds no data of, and
// must not serve it.
func TestANodeServesNoSliceItListsBeforeItAddsIt(t *testing.T) {
	n := testNode(t, &loadingRecorder{})
	a, b := rng(0, 1<<63), rngEnd(1<<63)
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 1, To: 4, Ops: []Op{{Kind: OpReset}, {Kind: OpSetSlices, Slices: []Range{a}},
		{Kind: OpAddSlice, Range: a}, {Kind: OpSliceLoaded, Range: a}}, Generation: 2}))
	require.True(t, n.Serving(keyIn(t, a)))
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 1, From: 4, To: 5, Ops: []Op{{Kind: OpSetSlices, Slices: []Range{a, b}}}, Generation: 2}))
	assert.False(t, n.Serving(keyIn(t, b)), "listed, not added: no data yet")
	assert.True(t, n.Loading(Hash(keyIn(t, b))))
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 1, From: 5, To: 7, Ops: []Op{{Kind: OpAddSlice, Range: b}, {Kind: OpSliceLoaded, Range: b}}, Generation: 3}))
	assert.True(t, n.Serving(keyIn(t, b)))
	assert.True(t, n.Serving(keyIn(t, a)))
}

func nilIfEmpty(rs []Range) []Range {
	if len(rs) == 0 {
		return nil
	}
	return rs
}

// TestNodeWithoutLoadingStoreRestartsWithASnapshot: a store that cannot keep the loading
// ranges gets the zero cursor while a range loads, so that a node restarted then takes a
// snapshot, and the real cursor again once nothing loads.
func TestNodeWithoutLoadingStoreRestartsWithASnapshot(t *testing.T) {
	s := &recordingBatch{}
	n := testNode(t, s)
	a := rng(0, 1<<62)
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 1, To: 2, Ops: []Op{{Kind: OpReset}, {Kind: OpAddSlice, Range: a}}}))
	assert.Equal(t, Cursor{}, s.cursor, "committed while loading: a restart takes a snapshot")
	assert.Equal(t, Cursor{1, 2}, n.Cursor(), "the running node keeps its place")
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 1, From: 2, To: 3, Ops: []Op{{Kind: OpSliceLoaded, Range: a}}}))
	assert.Equal(t, Cursor{1, 3}, s.cursor)
	assert.Empty(t, testNode(t, s).LoadingRanges())
}

// TestHeartbeatReportsLoading checks what a heartbeat says of the node's data.
func TestHeartbeatReportsLoading(t *testing.T) {
	n := testNode(t, &loadingRecorder{})
	a := rng(0, 1<<62)
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 1, To: 2, Ops: []Op{{Kind: OpReset}, {Kind: OpAddSlice, Range: a}}, Generation: 3}))
	req := n.heartbeatRequest()
	assert.Equal(t, uint64(3), req.GetGeneration())
	require.Len(t, req.GetLoading(), 1)
	assert.Equal(t, uint64(0), req.GetLoading()[0].GetStart())
	assert.Equal(t, uint64(1<<62), req.GetLoading()[0].GetEnd())
	select {
	case <-n.loaded:
		t.Fatal("nothing finished loading yet")
	default:
	}
	require.NoError(t, n.apply(t.Context(), Delta{Epoch: 1, From: 2, To: 3, Ops: []Op{{Kind: OpSliceLoaded, Range: a}}, Generation: 3}))
	assert.Empty(t, n.heartbeatRequest().GetLoading())
	select {
	case <-n.loaded: // a heartbeat is asked for soon
	default:
		t.Fatal("a range that finished loading asks for a heartbeat")
	}
}
