package quantum

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// nodeIDs returns n distinct node IDs.
func nodeIDs(n int) []assignment.NodeID {
	out := make([]assignment.NodeID, n)
	for i := range out {
		out[i] = assignment.NodeID(fmt.Sprintf("node-%d", i))
	}
	return out
}

// choose is the documented rule, computed independently of For: scan the IDs in sorted order
// and keep the strictly highest score, so that ties go to the lower ID.
func choose(d Distributors, n assignment.NodeID) (string, bool) {
	ids := slices.Sorted(maps.Keys(d))
	best, found := "", false
	var bestScore uint64
	for _, id := range ids {
		s := xxhash.Sum64String(id + "\x00" + string(n))
		if !found || s > bestScore {
			best, bestScore, found = id, s, true
		}
	}
	return best, found
}

func TestDistributorsForEmptySet(t *testing.T) {
	for name, d := range map[string]Distributors{"nil": nil, "empty": {}} {
		id, addr, ok := d.For("node-1")
		assert.False(t, ok, name)
		assert.Empty(t, id, name)
		assert.Empty(t, addr, name)
	}
}

func TestDistributorsForFollowsTheRule(t *testing.T) {
	d := Distributors{"d1": "10.0.0.1:7000", "d2": "10.0.0.2:7000", "d3": "10.0.0.3:7000", "dist-4": "10.0.0.4:7000"}
	for _, n := range nodeIDs(200) {
		id, addr, ok := d.For(n)
		require.True(t, ok, n)
		want, _ := choose(d, n)
		assert.Equal(t, want, id, "node %s", n)
		assert.Equal(t, d[id], addr, "node %s: the chosen member's address", n)
	}
}

func TestDistributorsForIsDeterministic(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	nodes := nodeIDs(300)
	ref := Distributors{}
	for _, id := range ids {
		ref[id] = "addr-" + id
	}
	want := map[assignment.NodeID]string{}
	for _, n := range nodes {
		id, _, ok := ref.For(n)
		require.True(t, ok)
		want[n] = id
	}
	// The same set built in other insertion orders (and iterated in Go's random map orders)
	// gives the same answers.
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		perm := slices.Clone(ids)
		rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		d := make(Distributors, len(perm))
		for _, id := range perm {
			d[id] = "addr-" + id
		}
		for _, n := range nodes {
			id, addr, ok := d.For(n)
			require.True(t, ok)
			require.Equal(t, want[n], id, "round %d (order %v), node %s", round, perm, n)
			require.Equal(t, "addr-"+id, addr)
		}
	}
}

func TestDistributorsForSingleMember(t *testing.T) {
	d := Distributors{"only": "host:1"}
	for _, n := range nodeIDs(50) {
		id, addr, ok := d.For(n)
		require.True(t, ok)
		assert.Equal(t, "only", id)
		assert.Equal(t, "host:1", addr)
	}
}

func TestDistributorsAddMovesNodesOnlyToTheNewOne(t *testing.T) {
	before := Distributors{"d1": "a1", "d2": "a2", "d3": "a3"}
	after := maps.Clone(before)
	after["d4"] = "a4"
	moved := 0
	for _, n := range nodeIDs(1000) {
		was, _, _ := before.For(n)
		now, _, _ := after.For(n)
		if now != was {
			assert.Equal(t, "d4", now, "node %s moved from %s, but not to the new distributor", n, was)
			moved++
		}
	}
	assert.Positive(t, moved, "the new distributor takes some nodes")
}

func TestDistributorsRemoveMovesOnlyTheRemovedOnesNodes(t *testing.T) {
	before := Distributors{"d1": "a1", "d2": "a2", "d3": "a3", "d4": "a4"}
	after := maps.Clone(before)
	delete(after, "d2")
	for _, n := range nodeIDs(1000) {
		was, _, _ := before.For(n)
		now, _, ok := after.For(n)
		require.True(t, ok)
		if was != "d2" {
			assert.Equal(t, was, now, "node %s moved though its distributor stayed", n)
		} else {
			assert.NotEqual(t, "d2", now, "node %s still chooses the removed distributor", n)
		}
	}
}

func TestDistributorsBalanceLoosely(t *testing.T) {
	d := Distributors{"d1": "a1", "d2": "a2", "d3": "a3", "d4": "a4"}
	const n = 1000
	counts := map[string]int{}
	for _, node := range nodeIDs(n) {
		id, _, ok := d.For(node)
		require.True(t, ok)
		counts[id]++
	}
	require.Len(t, counts, 4, "every distributor serves some nodes: %v", counts)
	for id, c := range counts {
		assert.GreaterOrEqual(t, c, n*15/100, "distributor %s: %v", id, counts)
		assert.LessOrEqual(t, c, n*35/100, "distributor %s: %v", id, counts)
	}
}

func TestDistributorsEqual(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b Distributors
		want bool
	}{
		{"both nil", nil, nil, true},
		{"nil and empty", nil, Distributors{}, true},
		{"same", Distributors{"a": "1", "b": "2"}, Distributors{"b": "2", "a": "1"}, true},
		{"other address", Distributors{"a": "1"}, Distributors{"a": "2"}, false},
		{"other id", Distributors{"a": "1"}, Distributors{"b": "1"}, false},
		{"subset", Distributors{"a": "1"}, Distributors{"a": "1", "b": "2"}, false},
		{"empty and one", Distributors{}, Distributors{"a": "1"}, false},
	} {
		assert.Equal(t, tc.want, tc.a.Equal(tc.b), tc.name)
		assert.Equal(t, tc.want, tc.b.Equal(tc.a), "%s (reversed)", tc.name)
	}
}

var distributorID = rapid.StringMatching(`[a-z0-9._:-]{1,12}`)

func TestDistributorsChangesMoveOnlyWhatTheyMustProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ids := rapid.SliceOfNDistinct(distributorID, 1, 8, rapid.ID[string]).Draw(t, "distributors")
		nodes := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-z0-9-]{1,16}`), 1, 60, rapid.ID[string]).Draw(t, "nodes")
		d := Distributors{}
		for i, id := range ids {
			d[id] = fmt.Sprintf("addr-%d", i)
		}

		// Adding one: every node either stays or moves to the new distributor.
		added := distributorID.Filter(func(s string) bool { _, ok := d[s]; return !ok }).Draw(t, "added")
		grown := maps.Clone(d)
		grown[added] = "addr-new"
		for _, s := range nodes {
			n := assignment.NodeID(s)
			was, wasAddr, ok := d.For(n)
			if !ok || d[was] != wasAddr {
				t.Fatalf("node %q: For(%v) = %q %q %v", n, d, was, wasAddr, ok)
			}
			now, nowAddr, ok := grown.For(n)
			if !ok || grown[now] != nowAddr {
				t.Fatalf("node %q: For(%v) = %q %q %v", n, grown, now, nowAddr, ok)
			}
			if now != was && now != added {
				t.Fatalf("adding %q moved node %q from %q to %q", added, n, was, now)
			}
		}

		// Removing one: only its nodes move, to some remaining distributor.
		if len(ids) < 2 {
			return
		}
		removed := rapid.SampledFrom(ids).Draw(t, "removed")
		shrunk := maps.Clone(d)
		delete(shrunk, removed)
		for _, s := range nodes {
			n := assignment.NodeID(s)
			was, _, _ := d.For(n)
			now, nowAddr, ok := shrunk.For(n)
			switch {
			case !ok || shrunk[now] != nowAddr:
				t.Fatalf("node %q: For(%v) = %q %q %v", n, shrunk, now, nowAddr, ok)
			case was != removed && now != was:
				t.Fatalf("removing %q moved node %q from %q to %q", removed, n, was, now)
			case now == removed:
				t.Fatalf("node %q still chooses the removed %q", n, removed)
			}
		}
	})
}

func TestRankPutsForFirstAndMovesOnlyWhatWasThere(t *testing.T) {
	d := Distributors{"d1": "a:1", "d2": "a:2", "d3": "a:3", "d4": "a:4"}
	for _, key := range []string{"n1", "router-7", "member-x", ""} {
		ranked := d.Rank(key)
		require.Len(t, ranked, 4)
		id, _, _ := d.For(assignment.NodeID(key))
		assert.Equal(t, id, ranked[0], "the first is For's choice for %q", key)
		// Without the first, the rest keep their order: a relay that goes moves only its own.
		rest := Distributors{}
		for _, r := range ranked[1:] {
			rest[r] = d[r]
		}
		assert.Equal(t, ranked[1:], rest.Rank(key))
	}
}
