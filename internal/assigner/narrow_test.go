package assigner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/store"
)

func span(start uint64, end keyspace.Bound) keyspace.Range { return keyspace.Range{Start: start, End: end} }

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
	a := store.Quarantine{Range: span(0, keyspace.At(10)), Since: at, Nodes: []assignment.NodeID{"x", "y"}}
	b := store.Quarantine{Range: span(20, keyspace.At(30)), Since: at.Add(time.Second), Nodes: []assignment.NodeID{"z", "y"}}
	a2 := store.Quarantine{Range: span(40, keyspace.At(50)), Since: at, Nodes: []assignment.NodeID{"x", "y"}}
	got := regroup([]store.Quarantine{a, b, a2}, groupOf(a), keyspace.NewSet(span(5, keyspace.At(10)), span(40, keyspace.At(42))))
	assert.Equal(t, []store.Quarantine{
		{Range: span(5, keyspace.At(10)), Since: at, Nodes: a.Nodes},
		{Range: span(40, keyspace.At(42)), Since: at, Nodes: a.Nodes},
		b,
	}, got)
	assert.Equal(t, []store.Quarantine{b}, regroup([]store.Quarantine{a, b, a2}, groupOf(a), keyspace.Set{}), "a lifted quarantine leaves no record")
}
