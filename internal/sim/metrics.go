package sim

import (
	"maps"
	"math"
	"slices"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// forecastError returns the error of a forecast of each node's load against the load it
// actually served: the mean over nodes of |forecast - actual|, as a fraction of the mean
// node load (sum |forecast - actual| / sum actual; a load-weighted mean absolute percentage
// error). The plain mean of per-node percentages would be ruled by nearly idle nodes: a node
// expected to carry the mean load that served 0.1% of it scores 100,000%. With no load at all
// it is 0.
func forecastError(forecast, actual []float64) float64 {
	var diff, sum float64
	for i, a := range actual {
		diff += math.Abs(forecast[i] - a)
		sum += a
	}
	if sum <= 0 {
		return 0
	}
	return diff / sum
}

// thrashing records each node's load, relative to the mean node load of the epoch, epoch by
// epoch, to score how much loads swing back and forth over a run.
type thrashing struct {
	series map[assignment.NodeID][]float64
}

func newThrashing() *thrashing { return &thrashing{series: map[assignment.NodeID][]float64{}} }

// add records one epoch's node loads, in the order of nodes. Loads are divided by the epoch's
// mean, so that load that rises and falls everywhere at once (a diurnal cycle) is no swing:
// only load moved between nodes is.
func (t *thrashing) add(nodes *assignment.NodeSet, loads []float64) {
	var mean float64
	for _, l := range loads {
		mean += l / float64(len(loads))
	}
	for i, n := range nodes.Nodes() {
		rel := 1.0
		if mean > 0 {
			rel = loads[i] / mean
		}
		t.series[n.ID] = append(t.series[n.ID], rel)
	}
}

// score returns the run's oscillation score: the mean over nodes of the trend-discounted total
// variation of the node's relative load, per epoch of its life. A node whose load only falls
// (or only rises) towards the mean scores 0 however far it moved; one that swings between 1.0
// and 1.2 of the mean every epoch scores about 0.2. See tdtv.
func (t *thrashing) score() float64 {
	var sum float64
	n := 0
	for _, id := range slices.Sorted(maps.Keys(t.series)) { // sorted: the sum is deterministic
		s := t.series[id]
		if len(s) < 2 {
			continue
		}
		var up, down float64
		for i := 1; i < len(s); i++ {
			if d := s[i] - s[i-1]; d > 0 {
				up += d
			} else {
				down -= d
			}
		}
		sum += tdtv(up, down) / float64(len(s)-1)
		n++
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// tdtv is the trend-discounted total variation of a series that rose by up and fell by down
// in all: the movement against the dominant direction, counted going and coming back, 2 *
// min(up, down). It is 0 for a monotonic series, the total variation up + down when neither
// direction dominates, symmetric, and scales with the series; a trend (a node filling up
// after it joined, a hot node cooling down as the balancer works) costs nothing, while every
// unit that went one way and came back costs two, as a slice moved away and back does.
func tdtv(up, down float64) float64 { return 2 * min(up, down) }
