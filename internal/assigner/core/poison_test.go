package core

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
)

// passAll runs a pass, commits what it proposes, and fails the test if it fails.
func passAll(t *testing.T, c *Core, at time.Time) {
	t.Helper()
	require.False(t, passAt(t, c, at).failed)
}

// onDeparted lists the slices held by a node that is not registered (I1 broken).
func onDeparted(c *Core) []string {
	var out []string
	for _, s := range c.a.All() {
		for _, id := range s.Replicas {
			if _, ok := c.nodes[id]; !ok {
				out = append(out, s.String())
			}
		}
	}
	return out
}

// TestHugeReportsCannotPoisonTheCore reproduces the finding: a registered node reporting a
// finite but huge load (1e308) twice made every load +Inf, the imbalance NaN and every pass
// fail, and once the node went silent its slices stayed on it. Such a report is now
// refused whole and changes nothing.
func TestHugeReportsCannotPoisonTheCore(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b")
	passAll(t, c, t0)
	huge := func(node assignment.NodeID) load.Report {
		var ss []load.Sample
		for _, s := range c.a.All() {
			if s.Holds(node) {
				ss = append(ss, load.Sample{Range: s.Range, Load: 1e308})
			}
		}
		return load.Report{Node: node, At: t0, Window: time.Second, Samples: ss}
	}
	before := c.est
	for i := range 2 {
		err := report(c, t0.Add(time.Duration(i)*time.Second), huge("b"))
		require.Error(t, err, "report %d", i)
		assert.ErrorIs(t, err, ErrInvalid)
		assert.ErrorIs(t, err, load.ErrOverCap)
		assert.Contains(t, err.Error(), "loads[0]", "the error names the field and the sample")
	}
	assert.Same(t, before, c.est)
	// a keeps reporting; b goes silent and its lease lapses.
	at := t0
	for range 15 {
		at = at.Add(time.Second)
		require.NoError(t, report(c, at, load.Report{Node: "a", Window: time.Second}))
		passAll(t, c, at) // b expires first
		st := c.Status()
		require.False(t, math.IsNaN(st.Imbalance) || math.IsInf(st.Imbalance, 0), "imbalance %v", st.Imbalance)
	}
	assert.NotContains(t, c.nodes, assignment.NodeID("b"))
	assert.Empty(t, onDeparted(c), "I1: no slice on a node that left")
	assert.Zero(t, c.Status().PassFailures)
}

func TestReportsAreCappedByCapacityAndWindow(t *testing.T) {
	c, err := New(Config{MaxLoadRate: 1000, Algorithm: "weighted-move", Params: smallParams})
	require.NoError(t, err)
	lead(t, c, 7, State{}, false, 0)
	ok(t, c, t0, Register{Node: Node{Node: assignment.Node{ID: "a", Capacity: 2}, Address: "a:1"}})
	full := keyspace.Full()
	send := func(l, keys float64, window time.Duration) error {
		return report(c, t0, load.Report{Node: "a", Window: window, Samples: []load.Sample{{Range: full, Load: l, Keys: keys}}})
	}
	// 1000 a second × 2 s × capacity 2.
	require.NoError(t, send(4000, 10, 2*time.Second))
	for _, tc := range []struct {
		load, keys float64
		window     time.Duration
		reason     string
		text       string
	}{
		{4001, 0, 2 * time.Second, "over_cap", "loads[0] = 4001, above the cap of 4000"},
		{math.Inf(1), 0, time.Second, "not_finite", "loads[0] = +Inf"},
		{math.NaN(), 0, time.Second, "not_finite", "loads[0] = NaN"},
		{-1, 0, time.Second, "negative", "loads[0] = -1"},
		{1, math.Inf(1), time.Second, "not_finite", "keys[0] = +Inf"},
		{1, 1e300, time.Second, "over_cap", "keys[0] = 1e+300"},
		{1, 0, 2 * time.Hour, "malformed", "window 2h0m0s"},
		{1, 0, 0, "malformed", "window 0s"},
	} {
		err := send(tc.load, tc.keys, tc.window)
		require.Error(t, err, tc.text)
		assert.ErrorIs(t, err, ErrInvalid)
		assert.Contains(t, err.Error(), tc.text)
		assert.Equal(t, tc.reason, load.Reason(err), tc.text)
	}
	// Samples that add up above the cap are refused too: each alone is fine.
	half := keyspace.Range{Start: 0, End: keyspace.At(1 << 63)}
	err = report(c, t0, load.Report{Node: "a", Window: time.Second, Samples: []load.Sample{{Range: half, Load: 1500}, {Range: half, Load: 1500}}})
	assert.ErrorIs(t, err, load.ErrOverCap)
	err = report(c, t0, load.Report{Node: "a", Window: time.Second, HotKeys: []load.HotKey{{Hash: 1, Load: 3000}}})
	assert.ErrorIs(t, err, load.ErrOverCap)
	assert.Contains(t, err.Error(), "hot_keys[0].load")

	_, err = New(Config{MaxLoadRate: math.Inf(1)})
	assert.Error(t, err)
	_, err = New(Config{MaxLoadRate: -1})
	assert.Error(t, err)
}

func TestRegistrationsAreBounded(t *testing.T) {
	c := newCore(t)
	long := strings.Repeat("x", 10<<10)
	for _, tc := range []struct {
		n    Node
		text string
	}{
		{Node{Node: assignment.Node{ID: "a"}}, "no address"},
		{Node{Node: assignment.Node{ID: "a", Capacity: 1e-300}, Address: "a:1"}, "capacity 1e-300"},
		{Node{Node: assignment.Node{ID: "a", Capacity: 1e300}, Address: "a:1"}, "capacity 1e+300"},
		{Node{Node: assignment.Node{ID: "a"}, Address: long}, "address of 10240 bytes"},
		{Node{Node: assignment.Node{ID: "a"}, Address: "a:1", Labels: map[string]string{long: "v"}}, "label"},
		{Node{Node: assignment.Node{ID: "a"}, Address: "a:1", Labels: map[string]string{"k": long}}, "label"},
		{Node{Node: assignment.Node{ID: "a"}, Address: "a:1", Labels: map[string]string{"": "v"}}, "label"},
	} {
		err := settleErr(c, t0, Register{Node: tc.n})
		require.ErrorIs(t, err, ErrInvalid, tc.text)
		assert.Contains(t, err.Error(), tc.text)
		assert.Less(t, len(err.Error()), 400, "the error does not echo the input whole")
	}
	assert.Empty(t, c.nodes)
}

// failing is an algorithm whose passes fail, for whatever reason a real one might.
type failing struct{ balance.Algorithm }

func (failing) Rebalance(balance.Input) (balance.Result, error) {
	return balance.Result{}, errors.New("balance: something broke")
}

// TestAFailedPassStillCleansUp: whatever makes the algorithm fail, the slices of departed
// nodes leave them (I1), without the algorithm, and the failure is on record.
func TestAFailedPassStillCleansUp(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b", "c")
	passAll(t, c, t0)
	c.alg = failing{c.alg}
	gen := c.a.Generation()
	s := passAt(t, c, t0)
	require.True(t, s.failed)
	assert.Empty(t, s.writes, "nothing to clean up")

	// The clean-up that follows a departure at once fails to be stored: the slices stay on
	// the departed node until a pass, which fails, falls back to cleaning up.
	require.NotNil(t, c.Step(t0, Deregister{Node: "c"}).Write)
	require.NotNil(t, c.Step(t0, WriteCommitted{}).Write, "the clean-up follows the departure")
	c.Step(t0, WriteFailed{Err: errors.New("etcd: request timed out")})
	require.NotEmpty(t, onDeparted(c))
	s = passAt(t, c, t0.Add(time.Second))
	require.True(t, s.failed)
	assert.Empty(t, onDeparted(c), "I1 holds after the clean-up")
	assert.Greater(t, c.a.Generation(), gen)
	require.NoError(t, c.a.Validate(c.registered()))
	held := map[assignment.NodeID]int{}
	for _, s := range c.a.All() {
		for _, id := range s.Replicas {
			held[id]++
		}
	}
	assert.InDelta(t, held["a"], held["b"], 1, "the orphans are spread: %v", held)
	require.Len(t, s.writes, 1)
	require.NotNil(t, s.writes[0].Entry)
	assert.Equal(t, "cleanup", s.writes[0].Entry.Cause)

	st := c.Status()
	assert.Equal(t, uint64(2), st.PassFailures)
	assert.Contains(t, st.PassError, "something broke")
	assert.Equal(t, t0.Add(time.Second), st.PassErrorTime)

	c.alg = c.alg.(failing).Algorithm
	passAll(t, c, t0.Add(2*time.Second))
	x := c.Explain()
	assert.Zero(t, x.Failures, "a pass that succeeds ends the run of failures")
	assert.Contains(t, x.Error, "something broke", "the last failure stays on record")
}

// TestPinAndUnpinAreIdempotent: pinning a pinned slice and unpinning one that is not pinned
// both succeed and change nothing, as etcd's and PD's writes of what already holds do.
func TestPinAndUnpinAreIdempotent(t *testing.T) {
	c := newCore(t)
	register(t, c, "a")
	passAll(t, c, t0)
	ref := SliceRef{Hash: new(uint64)}
	s := ok(t, c, t0, Pin{Slice: ref})
	assert.True(t, s.reply.Change.Persisted)
	s2 := ok(t, c, t0, Pin{Slice: ref})
	assert.False(t, s2.reply.Change.Persisted, "pinned already: nothing to store")
	assert.Empty(t, s2.writes)
	assert.Contains(t, s2.reply.Change.Summary, "already pinned")
	assert.Equal(t, s.reply.Range, s2.reply.Range)
	assert.Len(t, c.meta.Pins, 1, "one pin, not two")

	ok(t, c, t0, Unpin{Slice: ref})
	assert.Empty(t, c.meta.Pins)
	s = settle(t, c, t0, Unpin{Slice: ref})
	require.NoError(t, s.reply.Err, "unpinning what is not pinned is no error")
	assert.False(t, s.reply.Change.Persisted)
	assert.Contains(t, s.reply.Change.Summary, "not pinned")
}
