package heatmap

import (
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// The kinds of events.
const (
	KindMove    = "move"    // a slice's replicas changed
	KindSplit   = "split"   // a slice was split (Range is empty, at the split point)
	KindMerge   = "merge"   // two slices were merged (Range is the merged slice)
	KindPrimary = "primary" // only a slice's roles changed
	KindDrain   = "drain"   // a node was drained (Range is the whole space)
)

// Event is a change of the map, drawn over the heatmap.
type Event struct {
	// Seq is the newest column when it happened: it shows from the next one.
	Seq   uint64
	At    time.Time
	Kind  string
	Range keyspace.Range
	// Cause and By are the quantum's: what made the change and whose call it was.
	Cause, By string
	// What says it in a few words: "n1 → n2".
	What string
}

func eventBytes(e *Event) int {
	return 96 + len(e.Kind) + len(e.Cause) + len(e.By) + len(e.What)
}

// Add records an event; the oldest makes room when the ring is full. Its Seq is set to the
// newest column's.
func (h *History) Add(e Event) {
	e.Seq = h.next - 1
	h.add(e)
}

// add records e as it is.
func (h *History) add(e Event) {
	if len(h.events) < h.cfg.Events {
		h.events = append(h.events, e)
		h.evN++
		return
	}
	h.events[h.evFst] = e
	h.evFst = (h.evFst + 1) % len(h.events)
}

// MaxQuantumEvents bounds the events a quantum adds: a pass over a large map makes thousands of
// changes, more than a screen can show apart, and looking each up would cost the pass.
const MaxQuantumEvents = 256

// Observe adds the events of a quantum that changed the map, before being the map it applies
// to, at most MaxQuantumEvents of them (its first ops). Each event's range is as before has it
// (an op on a slice that an earlier op of the same quantum made is drawn over the slice it
// came from): replaying the ops one by one would copy the map for each. A clock-only or
// reinitializing quantum adds none.
func (h *History) Observe(q quantum.Quantum, before *assignment.Assignment) {
	if q.ClockOnly() || q.Reinitializing() || before == nil {
		return
	}
	for _, op := range q.Ops[:min(len(q.Ops), MaxQuantumEvents)] {
		e := Event{At: q.Time, Cause: q.Cause, By: q.By}
		switch o := op.(type) {
		case assignment.Split:
			e.Kind, e.Range = KindSplit, keyspace.Range{Start: o.At, End: keyspace.At(o.At)}
		case assignment.Merge:
			i, s := before.Lookup(o.Left)
			e.Kind, e.Range = KindMerge, s.Range
			if i+1 < before.Len() {
				e.Range.End = before.Slice(i + 1).Range.End
			}
		case assignment.Assign:
			e.Range, e.Kind, e.What = assignEvent(o, before)
		default:
			continue
		}
		h.Add(e)
	}
}

// assignEvent says what an Assign changed: its range in before, and whether the replicas or
// only the roles changed.
func assignEvent(o assignment.Assign, before *assignment.Assignment) (keyspace.Range, string, string) {
	_, s := before.Lookup(o.Slice)
	what := assignment.FormatReplicas(s.Replicas) + " → " + assignment.FormatReplicas(o.Replicas)
	if slices.Equal(s.Replicas, o.Replicas) {
		return s.Range, KindPrimary, "primary " + orNone(s.Primary) + " → " + orNone(o.Primary)
	}
	return s.Range, KindMove, what
}

func orNone(id assignment.NodeID) string {
	if id == "" {
		return "none"
	}
	return string(id)
}

// Events returns the events recorded after column from and at or before column to that
// overlap r, oldest first, at most limit of them (the newest ones).
func (h *History) Events(from, to uint64, r keyspace.Range, limit int) []Event {
	var out []Event
	for i := h.evN - 1; i >= 0 && len(out) < limit; i-- {
		e := h.events[(h.evFst+i)%len(h.events)]
		if e.Seq+1 < from || e.Seq+1 > to {
			continue
		}
		if e.Range.Valid() && !e.Range.Overlaps(r) || !e.Range.Valid() && !r.Contains(e.Range.Start) {
			continue
		}
		out = append(out, e)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}
