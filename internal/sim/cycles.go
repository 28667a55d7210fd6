package sim

import "github.com/sliceplane/sliceplane/internal/assignment"

// cycleWindow is how many passes after a split a merge that joins its pieces again counts as
// undoing it: a split/merge cycle.
const cycleWindow = 10

// cycleTracker counts split/merge cycles from the maps alone: a boundary between slices that a
// pass made (a split) and a pass fewer than cycleWindow passes later removed (a merge). Each
// copies nothing by itself, but a merge of pieces that moved apart copies one of them, and a
// balancer that keeps splitting and merging the same ranges spends churn on nothing.
type cycleTracker struct {
	born map[uint64]int // boundaries made during the run, and the pass that made them
}

func newCycleTracker() *cycleTracker { return &cycleTracker{born: map[uint64]int{}} }

// observe records the change from map from to map to made at pass pass and returns the
// cycles it closed.
func (t *cycleTracker) observe(pass int, from, to *assignment.Assignment) int {
	if from == nil || to == nil || from == to {
		return 0
	}
	before, after := boundaries(from), boundaries(to)
	cycles := 0
	for b := range before {
		if after[b] {
			continue
		}
		if at, ok := t.born[b]; ok && pass-at < cycleWindow {
			cycles++
		}
		delete(t.born, b)
	}
	for b := range after {
		if !before[b] {
			t.born[b] = pass
		}
	}
	return cycles
}

// boundaries returns the starts of a's slices but the first.
func boundaries(a *assignment.Assignment) map[uint64]bool {
	out := make(map[uint64]bool, a.Len())
	for i, s := range a.All() {
		if i > 0 {
			out[s.Range.Start] = true
		}
	}
	return out
}
