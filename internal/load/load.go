// Package load turns load measurements into what the balancer reasons about: a load per current
// slice, a load per node, and the imbalance between nodes.
//
// Load is a non-negative number per range per window, in units the application chooses. A
// node's load is the sum, over the slices it holds, of the slice's load divided by the number
// of replicas serving it (replicas share a slice's requests evenly), divided by the node's
// capacity. Imbalance is the maximum node load over the mean.
package load

import (
	"errors"
	"fmt"
	"math"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// ErrBadSample is wrapped by errors about unusable measurements.
var ErrBadSample = errors.New("load: bad sample")

// Sample is the load measured on one range of the space during one window.
type Sample struct {
	Range keyspace.Range
	// Load is the measured load, >= 0.
	Load float64
	// Keys is the number of keys the range held, >= 0; 0 when unknown.
	Keys float64
}

// Validate reports whether the sample can be used.
func (s Sample) Validate() error {
	if !s.Range.Valid() {
		return fmt.Errorf("%w: range %s is empty", ErrBadSample, s.Range)
	}
	if !finiteNonNegative(s.Load) {
		return fmt.Errorf("%w: load %v on %s; want a finite number >= 0", ErrBadSample, s.Load, s.Range)
	}
	if !finiteNonNegative(s.Keys) {
		return fmt.Errorf("%w: key count %v on %s; want a finite number >= 0", ErrBadSample, s.Keys, s.Range)
	}
	return nil
}

func finiteNonNegative(x float64) bool { return x >= 0 && !math.IsInf(x, 1) } // NaN fails x >= 0

// Project spreads samples over the slices of a and returns the load and key count of each
// slice, indexed like a. A sample whose range no longer matches a slice (the slice was split
// or merged since it was measured) contributes to every slice it overlaps, in proportion to
// the overlap. Samples add up, so reports of several replicas of one slice sum to its load.
// It changes nothing and returns an error if any sample is invalid.
func Project(a *assignment.Assignment, samples []Sample) (loads, keys []float64, err error) {
	for i, s := range samples {
		if err := s.Validate(); err != nil {
			return nil, nil, fmt.Errorf("sample %d: %w", i, err)
		}
	}
	loads, keys = make([]float64, a.Len()), make([]float64, a.Len())
	for _, s := range samples {
		width := s.Range.Width()
		for i, _ := a.Lookup(s.Range.Start); i < a.Len(); i++ {
			overlap, ok := a.Slice(i).Range.Intersect(s.Range)
			if !ok {
				break
			}
			f := overlap.Width() / width
			loads[i] += s.Load * f
			keys[i] += s.Keys * f
		}
	}
	return loads, keys, nil
}

// Reproject spreads per-slice values measured on the slices of from (loads, key counts) over
// the slices of to, by overlap, as Project does for samples. It returns nil for nil values.
// Both maps are sorted, so one walk over the two does it, in time linear in their sizes.
func Reproject(from *assignment.Assignment, xs []float64, to *assignment.Assignment) ([]float64, error) {
	if xs == nil {
		return nil, nil
	}
	if len(xs) != from.Len() {
		return nil, fmt.Errorf("%w: %d values for %d slices", ErrBadSample, len(xs), from.Len())
	}
	for i, x := range xs {
		if !finiteNonNegative(x) {
			return nil, fmt.Errorf("%w: value %v of slice %s; want a finite number >= 0", ErrBadSample, x, from.Slice(i).Range)
		}
	}
	out := make([]float64, to.Len())
	i, j := 0, 0
	for i < from.Len() && j < to.Len() {
		f, t := from.Slice(i).Range, to.Slice(j).Range
		if o, ok := f.Intersect(t); ok {
			if f.Start == t.Start && f.End == t.End {
				out[j] += xs[i] // the same slice: no need to measure
			} else {
				out[j] += xs[i] * o.Width() / f.Width()
			}
		}
		// Step past whichever slice ends first (both, when they end together).
		switch f.End.Compare(t.End) {
		case -1:
			i++
		case 1:
			j++
		default:
			i, j = i+1, j+1
		}
	}
	return out, nil
}

// NodeLoads returns the load of every node of nodes, in the order of nodes.Nodes(), divided by
// its capacity. Each slice's load is shared evenly among its replicas that are in nodes; the
// load of a slice with no replica in nodes is served by nobody and counted nowhere.
func NodeLoads(a *assignment.Assignment, sliceLoads []float64, nodes *assignment.NodeSet) []float64 {
	out := make([]float64, nodes.Len())
	idx := make([]int, 0, 8)
	for i, s := range a.All() {
		idx = nodes.AppendIndices(idx[:0], s.Replicas)
		for _, n := range idx {
			out[n] += sliceLoads[i] / float64(len(idx))
		}
	}
	for n, node := range nodes.Nodes() {
		out[n] /= node.Weight()
	}
	return out
}

// Imbalance returns the maximum of xs divided by their mean: 1.0 is perfect balance. With no
// values or no load at all, it returns 1.
func Imbalance(xs []float64) float64 {
	var sum, top float64
	for _, x := range xs {
		sum += x
		top = max(top, x)
	}
	if len(xs) == 0 || sum <= 0 {
		return 1
	}
	// top/sum is at most 1, so this cannot overflow; top/(sum/n) can, when sum/n underflows
	// to 0 with loads near the smallest float.
	return top / sum * float64(len(xs))
}
