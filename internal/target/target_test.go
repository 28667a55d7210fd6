package target_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/target"
)

func TestNames(t *testing.T) {
	for _, ok := range []string{"a", "kv", "ads-index-2", "x1"} {
		assert.NoError(t, target.CheckName(ok), ok)
	}
	for _, bad := range []string{"", "KV", "-kv", "kv-", "k/v", "k.v", string(make([]byte, 64))} {
		assert.ErrorIs(t, target.CheckName(bad), target.ErrInvalid, "%q", bad)
	}
	assert.NoError(t, target.CheckRef(""), "the default target")
	assert.ErrorIs(t, target.CheckRef("KV"), target.ErrInvalid)
	assert.Equal(t, "/sp/", target.Root("/sp/", ""), "the default target's keys are where they were")
	assert.Equal(t, "/sp/", target.Root("/sp/", target.Default))
	assert.Equal(t, "/sp/t/kv/", target.Root("/sp/", "kv"))
	assert.Equal(t, "sliceplane.leader", target.LeaderHealthService(""))
	assert.Equal(t, "sliceplane.leader/kv", target.LeaderHealthService("kv"))
}

// TestRankMovesOnlyWhatItMust: every assigner ranks alike whatever the order it lists the
// others in; targets spread over the assigners; an assigner that leaves moves only the
// targets it owned, and one that joins takes only targets, never moves them between others.
func TestRankMovesOnlyWhatItMust(t *testing.T) {
	three := []string{"10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"}
	owners := map[string]string{}
	count := map[string]int{}
	for i := range 300 {
		name := fmt.Sprintf("svc-%d", i)
		r := target.Rank(name, three)
		require.Equal(t, r, target.Rank(name, []string{three[2], three[0], three[1]}), "the order given does not matter")
		owners[name] = r[0]
		count[r[0]]++
		assert.Equal(t, target.Owner, target.Of(r, r[0]))
		assert.Equal(t, target.Backup, target.Of(r, r[1]))
		assert.Equal(t, target.Neither, target.Of(r, r[2]))
	}
	for _, a := range three {
		assert.InDelta(t, 100, count[a], 30, "targets spread: %v", count)
	}
	two := three[:2]
	for name, was := range owners {
		now := target.Rank(name, two)[0]
		if was != three[2] {
			assert.Equal(t, was, now, "%s was not the leaver's: it stays", name)
		} else {
			assert.Equal(t, target.Rank(name, three)[1], now, "%s goes to its backup", name)
		}
	}
	four := append(slices.Clone(three), "10.0.0.4:7070")
	for name, was := range owners {
		if now := target.Rank(name, four)[0]; now != was {
			assert.Equal(t, four[3], now, "%s moves only to the newcomer", name)
		}
	}
	assert.Equal(t, target.Neither, target.Of(target.Rank("kv", nil), "x"))
}

// TestPlaceLeavesAHeavyTargetAlone: a heavy target (HeavySlices or more) has an owner that
// owns no other; the light targets spread over the rest by rendezvous, so that an
// assigner of light targets that leaves moves only its own; with none heavy, Place is Rank.
func TestPlaceLeavesAHeavyTargetAlone(t *testing.T) {
	assigners := []string{"a1:7070", "a2:7070", "a3:7070"}
	weights := map[string]int64{"big": 150_000}
	for i := range 100 {
		weights[fmt.Sprintf("t%03d", i)] = 2_000
	}
	placed := target.Place(weights, assigners, target.HeavySlices)
	bigOwner := placed["big"][0]
	require.Equal(t, target.Rank("big", assigners), placed["big"], "a heavy target is ranked among all")
	owned := map[string]int{}
	for name, ranked := range placed {
		require.Len(t, ranked, 3, name)
		owned[ranked[0]]++
		if name != "big" {
			assert.NotEqual(t, bigOwner, ranked[0], "%s is not led beside the heavy target", name)
			assert.Equal(t, bigOwner, ranked[2], "%s ranks the heavy target's owner last", name)
		}
	}
	assert.Equal(t, 1, owned[bigOwner])
	for _, a := range assigners {
		if a != bigOwner {
			assert.Greater(t, owned[a], 35, "the light targets spread over the other two: %v", owned)
		}
	}

	// A light assigner leaves: only its targets move.
	var victim string
	for _, a := range assigners {
		if a != bigOwner {
			victim = a
			break
		}
	}
	after := target.Place(weights, slices.DeleteFunc(slices.Clone(assigners), func(a string) bool { return a == victim }), target.HeavySlices)
	for name, ranked := range placed {
		if ranked[0] != victim {
			assert.Equal(t, ranked[0], after[name][0], "%s was not the leaver's: it stays", name)
		}
	}

	even := map[string]int64{"x": 2_000, "y": target.HeavySlices - 1, "z": 0}
	for name, ranked := range target.Place(even, assigners, target.HeavySlices) {
		assert.Equal(t, target.Rank(name, assigners), ranked, "no heavy target: Rank")
	}
	one := target.Place(map[string]int64{"big": 150_000, "t": 1}, assigners[:1], target.HeavySlices)
	assert.Equal(t, assigners[:1], one["big"], "one assigner leads everything")
	assert.Equal(t, assigners[:1], one["t"])
	two := target.Place(map[string]int64{"big": 150_000, "huge": 300_000, "t": 1}, assigners[:2], target.HeavySlices)
	assert.NotEqual(t, two["huge"][0], two["t"][0], "the largest heavy target has an assigner of its own")
	assert.Equal(t, two["big"][0], two["t"][0], "one assigner is left to the light targets, and to the heavy ones past it")
}
