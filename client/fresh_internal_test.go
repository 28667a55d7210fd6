package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

const testBound = 3 * time.Second

// at is a time t after an arbitrary start.
func at(t time.Duration) time.Time { return time.Unix(1_700_000_000, 0).Add(t) }

func assertFresh(t *testing.T, f *freshness, now time.Duration, want bool, reason string) {
	t.Helper()
	ok, why := f.fresh(at(now))
	assert.Equal(t, want, ok, "at %s: %q", now, why)
	assert.Contains(t, why, reason, "at %s", now)
}

func TestFreshnessWantsWordFromTheDistributorWithinTheBound(t *testing.T) {
	f := newFreshness(testBound, at(0))
	assertFresh(t, f, 0, false, "no word from a distributor yet")
	assertFresh(t, f, 4*time.Second, false, "since the node started")

	f.heardFrom(at(5*time.Second), 10, 0, 10, false)
	assertFresh(t, f, 5*time.Second, true, "")
	assertFresh(t, f, 8*time.Second, true, "") // exactly the bound
	assertFresh(t, f, 8*time.Second+time.Millisecond, false, "distributor silent for 3.001s")

	// Heartbeats of an idle stream keep it fresh, however long.
	for s := 8; s < 60; s++ {
		f.heardFrom(at(time.Duration(s)*time.Second), 10, 0, 10, false)
		assertFresh(t, f, time.Duration(s)*time.Second+time.Second, true, "")
	}
}

func TestFreshnessWantsTheChangesItsDistributorHadReadABoundAgo(t *testing.T) {
	f := newFreshness(testBound, at(0))
	f.heardFrom(at(0), 10, 0, 10, false)
	// The distributor reads on; the node's deltas arrive but it does not reach clock 20
	// (a long queue ahead of it), though it hears from its distributor all the while.
	f.heardFrom(at(1*time.Second), 20, 0, 12, false)
	f.heardFrom(at(2*time.Second), 30, 0, 15, false)
	assertFresh(t, f, 4*time.Second, true, "")
	f.heardFrom(at(4*time.Second+time.Millisecond), 40, 0, 19, false)
	assertFresh(t, f, 4*time.Second+time.Millisecond, false, "behind: at clock 19, the source at 20 for 3.001s")
	// Past 20: the oldest change it lacks was read at 2s, within the bound.
	f.heardFrom(at(4500*time.Millisecond), 40, 0, 25, false)
	assertFresh(t, f, 4500*time.Millisecond, true, "")
	assertFresh(t, f, 5*time.Second+time.Millisecond, false, "the source at 30")
	// Caught up with all it was told: fresh again, and stays so.
	f.heardFrom(at(6*time.Second), 40, 0, 40, false)
	assertFresh(t, f, 8*time.Second, true, "")
}

func TestFreshnessOfASnapshot(t *testing.T) {
	f := newFreshness(testBound, at(-time.Minute))
	f.heardFrom(at(0), 10, 0, 10, false)
	// A snapshot under way: the data is incomplete, whatever its clock.
	f.heardFrom(at(time.Second), 12, 0, 10, true)
	assertFresh(t, f, time.Second, false, "loading a snapshot")
	// It completes at clock 8, older than before: the node lacks changes it had, read by
	// its distributor before anyone can say, so it answers no reads until it has them again.
	f.heardFrom(at(2*time.Second), 12, 0, 8, false)
	assertFresh(t, f, 2*time.Second, false, "behind: at clock 8, the source at 10")
	f.heardFrom(at(2500*time.Millisecond), 12, 0, 11, false)
	assertFresh(t, f, 2500*time.Millisecond, true, "")
	assertFresh(t, f, 4*time.Second+time.Millisecond, false, "behind: at clock 11, the source at 12")
}

// A distributor that has not heard from its source for longer than the bound makes its
// nodes stale, though they applied all it read and it still talks to them: the source may
// have moved on out of its reach. Once it hears from the source again, they are fresh.
func TestFreshnessWantsTheDistributorToHearFromTheSource(t *testing.T) {
	f := newFreshness(testBound, at(0))
	f.heardFrom(at(0), 10, 0, 10, false)
	assertFresh(t, f, 0, true, "")
	// The source goes away at 1s: the distributor's heartbeats say so, growing.
	for s := 2; s <= 4; s++ {
		f.heardFrom(at(time.Duration(s)*time.Second), 10, time.Duration(s-1)*time.Second, 10, false)
		assertFresh(t, f, time.Duration(s)*time.Second, true, "")
	}
	assertFresh(t, f, 4*time.Second+time.Millisecond, false, "the distributor has not heard from its source for 3.001s")
	// No message at all counts as silence too, up to the distributor's own bound.
	assertFresh(t, f, 6*time.Second, false, "the distributor has not heard from its source for 5s")
	// The source answers again, with nothing new: fresh at once.
	f.heardFrom(at(7*time.Second), 10, 0, 10, false)
	assertFresh(t, f, 7*time.Second, true, "")
}

// However many source clocks it is told of, a freshness remembers a bounded number, and what
// it forgets makes it stop answering earlier, never later.
func TestFreshnessForgetsOnlyTowardsStale(t *testing.T) {
	f := newFreshness(testBound, at(0))
	for i := range 1000 {
		now := time.Duration(i) * time.Millisecond
		f.heardFrom(at(now), uint64(100+i), 0, 100, false)
		require.LessOrEqual(t, len(f.behind), maxSightings)
	}
	assert.Equal(t, at(time.Millisecond), f.behind[0].at, "the oldest sighting is kept")
	// Clock 100+k was first heard of at k ms: caught up to 500, the node lacks 501, heard
	// of at 501ms; the oldest it remembers lacking may be older, never newer.
	f.heardFrom(at(time.Second), 1100, 0, 500, false)
	require.NotEmpty(t, f.behind)
	assert.False(t, f.behind[0].at.After(at(501*time.Millisecond)), "remembered at %s", f.behind[0].at.Sub(at(0)))
	assertFresh(t, f, 3502*time.Millisecond, false, "behind: at clock 500")
}

// A router picks, for the reads of a slice, among its replicas that are not stale, if it
// has any.
func TestRoutersPreferFreshReplicas(t *testing.T) {
	nodes := map[assignment.NodeID]nodeInfo{"a": {address: "a:1", capacity: 1, stale: true}, "b": {address: "b:1", capacity: 1}, "c": {address: "c:1", capacity: 1}}
	r := newTestRouter(t, RoundRobin, everywhere(t, "a", "b", "c"), nodes)
	assert.Equal(t, map[string]int{"b": 5, "c": 5}, picks(t, r, 10))
	// Lookup gives every replica the map lists, saying which is stale.
	route, err := r.Lookup([]byte("k"))
	require.NoError(t, err)
	assert.Equal(t, []Replica{{ID: "a", Address: "a:1", Capacity: 1, Stale: true, Role: RoleReplica}, {ID: "b", Address: "b:1", Capacity: 1, Role: RoleReplica},
		{ID: "c", Address: "c:1", Capacity: 1, Role: RoleReplica}}, route.Replicas)

	// All stale: each may have caught up since, and a reader it turns away tries the next.
	r.setNodes(map[assignment.NodeID]nodeInfo{"a": {address: "a:1", capacity: 1, stale: true}, "b": {address: "b:1", capacity: 1, stale: true},
		"c": {address: "c:1", capacity: 1, stale: true}})
	assert.Equal(t, map[string]int{"a": 3, "b": 3, "c": 3}, picks(t, r, 9))

	// Fresh again: back in the rotation.
	r.setNodes(map[assignment.NodeID]nodeInfo{"a": {address: "a:1", capacity: 1}, "b": {address: "b:1", capacity: 1}, "c": {address: "c:1", capacity: 1}})
	assert.Equal(t, map[string]int{"a": 3, "b": 3, "c": 3}, picks(t, r, 9))
}

func TestValidateFreshnessBound(t *testing.T) {
	c := NodeConfig{ID: "n1", Store: &recordingBatch{}, Assigners: []string{"a:1"}, Address: "n1:1"}
	require.NoError(t, c.Validate())
	assert.Equal(t, 3*time.Second, c.FreshnessBound)
	c.FreshnessBound = -time.Second
	assert.Error(t, c.Validate())
}
