package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

func span(start uint64, end keyspace.Bound) keyspace.Range {
	return keyspace.Range{Start: start, End: end}
}

// TestAProbeTakesHalfOfAQuarantinesPoints checks the halves a probe lends: half of the points
// of a quarantine made of several ranges (a cold start's), cut inside the range that straddles
// the middle; of the whole space, whose size does not fit in a uint64; of a straddling
// range that runs to the end; and of ranges whose first is exactly the half.
func TestAProbeTakesHalfOfAQuarantinesPoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   keyspace.Set
		want keyspace.Set
	}{
		{"scattered", keyspace.NewSet(span(0, keyspace.At(100)), span(1000, keyspace.At(1100)), span(5000, keyspace.At(5200))),
			keyspace.NewSet(span(0, keyspace.At(100)), span(1000, keyspace.At(1100)))},
		{"straddling", keyspace.NewSet(span(0, keyspace.At(10)), span(1000, keyspace.At(1100))),
			keyspace.NewSet(span(0, keyspace.At(10)), span(1000, keyspace.At(1045)))},
		{"whole space", keyspace.NewSet(keyspace.Full()), keyspace.NewSet(span(0, keyspace.At(1<<63)))},
		{"to the end", keyspace.NewSet(span(0, keyspace.At(1<<62)), span(1<<63, keyspace.End)),
			keyspace.NewSet(span(0, keyspace.At(1<<62)), span(1<<63, keyspace.At(1<<63+1<<61)))},
		{"exact", keyspace.NewSet(span(0, keyspace.At(1<<62)), span(1<<63, keyspace.At(1<<63+1<<62))),
			keyspace.NewSet(span(0, keyspace.At(1<<62)))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, full := size(tc.in)
			got := firstHalf(tc.in, n, full)
			assert.Equal(t, tc.want.String(), got.String())
			if h, _ := size(got); !full {
				assert.Equal(t, n/2, h)
			}
		})
	}
	_, ok := nextPart(keyspace.NewSet(span(0, keyspace.At(narrowBound))), learnt{confirmed: true})
	assert.False(t, ok, "a quarantine of 1/1024 of the space is narrow enough")
	got, ok := nextPart(keyspace.NewSet(span(0, keyspace.At(narrowBound+2))), learnt{})
	assert.True(t, ok && got.Equal(keyspace.NewSet(span(0, keyspace.At(narrowBound/2+1)))), "a wider one is halved: %s", got)
	whole := keyspace.NewSet(span(0, keyspace.At(10)))
	got, ok = nextPart(whole, learnt{cleared: true})
	assert.True(t, ok && got.Equal(whole), "once a half was found innocent, before any crash, the rest is probed whole")
}

// TestRegroupKeepsOtherQuarantines checks that narrowing a quarantine rewrites its records
// only, where they were, and keeps its time and nodes.
func TestRegroupKeepsOtherQuarantines(t *testing.T) {
	at := t0
	a := Quarantine{Range: span(0, keyspace.At(10)), Since: at, Nodes: []assignment.NodeID{"x", "y"}}
	b := Quarantine{Range: span(20, keyspace.At(30)), Since: at.Add(time.Second), Nodes: []assignment.NodeID{"z", "y"}}
	a2 := Quarantine{Range: span(40, keyspace.At(50)), Since: at, Nodes: []assignment.NodeID{"x", "y"}}
	got := regroup([]Quarantine{a, b, a2}, groupOf(a), keyspace.NewSet(span(5, keyspace.At(10)), span(40, keyspace.At(42))))
	assert.Equal(t, []Quarantine{
		{Range: span(5, keyspace.At(10)), Since: at, Nodes: a.Nodes},
		{Range: span(40, keyspace.At(42)), Since: at, Nodes: a.Nodes},
		b,
	}, got)
	assert.Equal(t, []Quarantine{b}, regroup([]Quarantine{a, b, a2}, groupOf(a), keyspace.Set{}), "a lifted quarantine leaves no record")
}

// TestACanaryThatServedItsPartKeepsItsVerdict steps a canary that serves its part and whose
// lease then lapses before the pass that stores the verdict (the loop stalled between, say):
// its crash afterwards says nothing of the part, which stays innocent; the quarantine
// narrows to the other half, not to the part, and as no canary has crashed on it, that half
// is lent whole to the other node.
func TestACanaryThatServedItsPartKeepsItsVerdict(t *testing.T) {
	c, err := New(Config{NodeTTL: 10 * time.Second, Algorithm: "weighted-move", Params: smallParams,
		BreakBeforeMake: true, QuarantineProbe: 5 * time.Second})
	require.NoError(t, err)
	a, err := assignment.New(1, []assignment.Slice{
		{Range: span(0, keyspace.At(1<<63)), Replicas: []assignment.NodeID{"a"}},
		{Range: span(1<<63, keyspace.End), Replicas: []assignment.NodeID{"b"}},
	})
	require.NoError(t, err)
	quarantined := span(0, keyspace.At(1<<62))
	st := State{Assignment: a, Meta: Meta{Generation: 1, Algorithm: "weighted-move", Params: smallParams,
		Quarantined: []Quarantine{{Range: quarantined, Since: t0, Nodes: []assignment.NodeID{"x", "y"}}}}}
	for _, id := range []assignment.NodeID{"a", "b"} {
		st.Nodes = append(st.Nodes, Node{Node: assignment.Node{ID: id}, Address: string(id) + ":1"})
	}
	lead(t, c, 1, st, true, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	settle(t, c, at(time.Second), Tick{})
	require.Len(t, c.qw.probes, 1, "the quarantine's lower half is lent")
	p := c.qw.probes[0]
	canary, other := p.canary, assignment.NodeID("b")
	if canary == other {
		other = "a"
	}
	part := span(0, keyspace.At(1<<61))
	require.Equal(t, keyspace.NewSet(part).String(), p.part.String())
	ok(t, c, at(2*time.Second), Heartbeat{Node: canary, Generation: c.generation()})
	ok(t, c, at(8*time.Second), Heartbeat{Node: other})
	ok(t, c, at(8*time.Second), Heartbeat{Node: canary, Generation: c.generation()})
	require.True(t, p.served, "a heartbeat 5s after the canary loaded its part")
	ok(t, c, at(15*time.Second), Heartbeat{Node: other})
	var probes ProbeStats
	for _, out := range c.Settle(at(19*time.Second), Tick{}) { // the canary's lease lapsed at +18s
		probes.Started += out.Probes.Started
		probes.Crashed += out.Probes.Crashed
		probes.Served += out.Probes.Served
		probes.Abandoned += out.Probes.Abandoned
	}
	assert.NotContains(t, c.nodes, canary)
	assert.Equal(t, ProbeStats{Served: 1, Started: 1}, probes)
	require.Len(t, c.meta.Quarantined, 1)
	rest := span(1<<61, keyspace.At(1<<62))
	assert.Equal(t, rest, c.meta.Quarantined[0].Range, "narrowed to the half the canary did not hold")
	require.Len(t, c.qw.probes, 1)
	assert.Equal(t, keyspace.NewSet(rest).String(), c.qw.probes[0].part.String(), "no canary crashed on it: the rest is probed whole")
	assert.Equal(t, other, c.qw.probes[0].canary)
}
