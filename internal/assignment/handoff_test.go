package assignment

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// TestAHandoffKeepsTheOldHolderServing walks one move make-before-break: the gaining node
// loads, the losing one serves and leaves, and the Assign that ends the handoff drops it.
func TestAHandoffKeepsTheOldHolderServing(t *testing.T) {
	a, err := New(4, []Slice{{Range: r(0, 100), Replicas: ids("a")}, {Range: rEnd(100), Replicas: ids("b")}})
	require.NoError(t, err)
	b, resolved, err := a.Resolve([]Op{Handoff{Slice: 0, Replicas: ids("c")}})
	require.NoError(t, err)
	s := b.Slice(0)
	assert.Equal(t, ids("a", "c"), s.Replicas)
	assert.Equal(t, ids("c"), s.Loading)
	assert.Equal(t, ids("a"), s.Leaving)
	assert.Equal(t, uint64(5), s.Since, "the handoff starts at the generation it makes")
	assert.Equal(t, ids("a"), s.Serving(), "reads stay with the old holder")
	assert.Equal(t, ids("c"), s.Target())
	assert.True(t, s.IsLoading("c"))
	assert.False(t, s.IsLoading("a"))
	require.Equal(t, []Op{Assign{Slice: 0, Replicas: ids("a", "c"), Loading: ids("c"), Leaving: ids("a"), Since: 5}}, resolved)

	again, err := a.Apply(resolved)
	require.NoError(t, err)
	assert.True(t, again.Equal(b), "the resolved ops make the same map")

	done, err := b.Apply([]Op{Assign{Slice: 0, Replicas: s.Target()}})
	require.NoError(t, err)
	assert.False(t, done.Slice(0).InHandoff())
	assert.Equal(t, ids("c"), done.Slice(0).Serving())
}

func TestAHandoffThatOnlyDropsIsAPlainAssign(t *testing.T) {
	a, err := New(1, []Slice{{Range: r(0, 100), Replicas: ids("a", "b")}, {Range: rEnd(100), Replicas: ids("b")}})
	require.NoError(t, err)
	_, resolved, err := a.Resolve([]Op{Handoff{Slice: 0, Replicas: ids("b")}})
	require.NoError(t, err)
	assert.Equal(t, []Op{Assign{Slice: 0, Replicas: ids("b")}}, resolved)
}

func TestAHandoffDoesNotKeepADeadNode(t *testing.T) {
	a, err := New(1, []Slice{{Range: r(0, 100), Replicas: ids("a", "b")}, {Range: rEnd(100), Replicas: ids("b")}})
	require.NoError(t, err)
	live := MustNodeSet(Node{ID: "b"}, Node{ID: "c"})
	b, err := a.Apply([]Op{Handoff{Slice: 0, Replicas: ids("c"), Live: live}})
	require.NoError(t, err)
	s := b.Slice(0)
	assert.Equal(t, ids("b", "c"), s.Replicas, "the dead a goes at once, the live b serves until c does")
	assert.Equal(t, ids("b"), s.Leaving)
}

func TestAHandoffKeepsItsStartUnlessANodeJoinsIt(t *testing.T) {
	a, err := New(1, []Slice{{Range: r(0, 100), Replicas: ids("a")}, {Range: rEnd(100), Replicas: ids("b")}})
	require.NoError(t, err)
	b, err := a.Apply([]Op{Handoff{Slice: 0, Replicas: ids("c", "d")}})
	require.NoError(t, err)
	require.Equal(t, uint64(2), b.Slice(0).Since)
	c, err := b.Apply([]Op{Handoff{Slice: 0, Replicas: ids("c")}})
	require.NoError(t, err)
	assert.Equal(t, uint64(2), c.Slice(0).Since, "d dropped out; c keeps loading since generation 2")
	assert.Equal(t, ids("a", "c"), c.Slice(0).Replicas)
	d, err := c.Apply([]Op{Handoff{Slice: 0, Replicas: ids("c", "e")}})
	require.NoError(t, err)
	assert.Equal(t, uint64(4), d.Slice(0).Since, "e joined: the handoff restarts at generation 4")
}

func TestLeavingNodesLingerOnceTheNewOnesServe(t *testing.T) {
	s := Slice{Range: r(0, 1), Replicas: ids("a", "b"), Leaving: ids("a"), Since: 3}
	require.NoError(t, s.check())
	assert.True(t, s.InHandoff())
	assert.True(t, s.Lingering())
	assert.Equal(t, ids("a", "b"), s.Serving(), "both serve until a drops the slice")
	assert.Equal(t, ids("b"), s.Target())
}

func TestEverySliceServedWhenAllLoad(t *testing.T) {
	s := Slice{Range: r(0, 1), Replicas: ids("a", "b"), Loading: ids("a", "b"), Since: 3}
	assert.Equal(t, ids("a", "b"), s.Serving(), "with no serving replica a reader tries those loading")
}

func TestSplitsCarryAndMergesCompareTheHandoff(t *testing.T) {
	a, err := New(1, []Slice{{Range: r(0, 100), Replicas: ids("a")}, {Range: rEnd(100), Replicas: ids("a")}})
	require.NoError(t, err)
	b, err := a.Apply([]Op{Handoff{Slice: 0, Replicas: ids("b")}, Split{Slice: 0, At: 50}})
	require.NoError(t, err)
	assert.Equal(t, b.Slice(0).Loading, b.Slice(1).Loading, "both halves load")
	assert.Equal(t, b.Slice(0).Since, b.Slice(1).Since)
	_, err = b.Apply([]Op{Merge{Left: 50}})
	require.ErrorIs(t, err, ErrBadOp, "a loading slice does not merge with one that is not")
	c, err := b.Apply([]Op{Merge{Left: 0}})
	require.NoError(t, err)
	assert.Equal(t, r(0, 100), c.Slice(0).Range)
	assert.True(t, c.Slice(0).InHandoff())
}

func TestBadHandoffStatesAreRefused(t *testing.T) {
	for name, s := range map[string]Slice{
		"loading not a replica":    {Replicas: ids("a"), Loading: ids("b"), Since: 1},
		"leaving not a replica":    {Replicas: ids("a", "b"), Loading: ids("b"), Leaving: ids("c"), Since: 1},
		"both loading and leaving": {Replicas: ids("a", "b"), Loading: ids("b"), Leaving: ids("b"), Since: 1},
		"leaving with no loading":  {Replicas: ids("a", "b"), Leaving: ids("b")},
		"loading with no start":    {Replicas: ids("a", "b"), Loading: ids("b")},
		"a start with no loading":  {Replicas: ids("a"), Since: 1},
	} {
		s.Range = keyspace.Full()
		_, err := New(1, []Slice{s})
		require.ErrorIs(t, err, ErrBadHandoff, name)
		a, err := New(1, []Slice{{Range: keyspace.Full(), Replicas: ids("a")}})
		require.NoError(t, err)
		_, err = a.Apply([]Op{Assign{Slice: 0, Replicas: s.Replicas, Loading: s.Loading, Leaving: s.Leaving, Since: s.Since}})
		require.ErrorIs(t, err, ErrBadHandoff, name)
	}
}

func TestDiffCarriesHandoffs(t *testing.T) {
	a, err := New(1, []Slice{{Range: r(0, 100), Replicas: ids("a")}, {Range: rEnd(100), Replicas: ids("b")}})
	require.NoError(t, err)
	b, err := a.Apply([]Op{Handoff{Slice: 100, Replicas: ids("a")}})
	require.NoError(t, err)
	c, err := a.Apply(Diff(a, b))
	require.NoError(t, err)
	assert.True(t, c.Equal(b), "got\n%s\nwant\n%s", c, b)
	assert.False(t, c.Equal(a))
}

func TestAtTargetEndsEveryHandoff(t *testing.T) {
	a, err := New(4, []Slice{
		{Range: keyspace.Range{Start: 0, End: keyspace.At(10)}, Replicas: []NodeID{"a"}},
		{Range: keyspace.Range{Start: 10, End: keyspace.At(20)}, Replicas: []NodeID{"a", "b", "c"}, Loading: []NodeID{"c"}, Leaving: []NodeID{"a"}, Since: 3},
		{Range: keyspace.Range{Start: 20, End: keyspace.End}, Replicas: []NodeID{"b"}, Loading: []NodeID{"b"}, Since: 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := a.AtTarget()
	want, err := New(4, []Slice{
		{Range: keyspace.Range{Start: 0, End: keyspace.At(10)}, Replicas: []NodeID{"a"}},
		{Range: keyspace.Range{Start: 10, End: keyspace.At(20)}, Replicas: []NodeID{"b", "c"}},
		{Range: keyspace.Range{Start: 20, End: keyspace.End}, Replicas: []NodeID{"b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(want) || got.Generation() != 4 {
		t.Fatalf("AtTarget = %v, want %v", got, want)
	}
	if !a.Slice(1).InHandoff() {
		t.Fatal("AtTarget changed the map it was called on")
	}
	if plain := want.AtTarget(); plain != want {
		t.Fatal("a map with no handoff is its own target")
	}
}

// TestAHandoffThatDropsThePrimaryLingers: with roles, a drop of the live primary (a replica
// removed, no node gaining the slice) lingers, so that the primary hands its role over before
// it goes; a drop of a secondary, or of a dead primary, is at once.
func TestAHandoffThatDropsThePrimaryLingers(t *testing.T) {
	a, err := New(1, []Slice{{Range: r(0, 100), Replicas: ids("a", "b"), Primary: "a"}, {Range: rEnd(100), Replicas: ids("b"), Primary: "b"}})
	require.NoError(t, err)
	b, err := a.Apply([]Op{Handoff{Slice: 0, Replicas: ids("b")}})
	require.NoError(t, err)
	s := b.Slice(0)
	assert.Equal(t, ids("a", "b"), s.Replicas)
	assert.Empty(t, s.Loading)
	assert.Equal(t, ids("a"), s.Leaving)
	assert.Equal(t, uint64(2), s.Since)
	assert.True(t, s.Lingering())

	c, err := New(1, []Slice{{Range: r(0, 100), Replicas: ids("a", "b"), Primary: "b"}, {Range: rEnd(100), Replicas: ids("b"), Primary: "b"}})
	require.NoError(t, err)
	d, err := c.Apply([]Op{Handoff{Slice: 0, Replicas: ids("b")}})
	require.NoError(t, err)
	assert.Equal(t, ids("b"), d.Slice(0).Replicas, "a secondary goes at once")
	assert.False(t, d.Slice(0).InHandoff())

	e, err := a.Apply([]Op{Handoff{Slice: 0, Replicas: ids("b"), Live: MustNodeSet(Node{ID: "b"})}})
	require.NoError(t, err)
	assert.Equal(t, ids("b"), e.Slice(0).Replicas, "a dead primary goes at once")
}
