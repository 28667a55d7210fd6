package load

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// HotKey is a key that carries a noticeable share of its slice's load, as a node's
// heavy-hitter sketch reports it.
type HotKey struct {
	Hash uint64
	Load float64
}

// Report is what one node measured over one window.
type Report struct {
	Node assignment.NodeID
	// At is when the window ended; Window is its length.
	At     time.Time
	Window time.Duration
	// Samples give the load of each range the node holds. A node with replicas reports its
	// own share: the requests it served.
	Samples []Sample
	// HotKeys lists the heaviest keys the node saw, with the load it served for each.
	HotKeys []HotKey
}

// EstimatorConfig tunes how reports become estimates.
type EstimatorConfig struct {
	// HalfLife is how fast old measurements fade: after HalfLife, a slice's estimate has moved
	// halfway to what the reports say. Default 10 s (Dicer's).
	HalfLife time.Duration
	// MaxAge ignores reports older than this. Default 6 half-lives.
	MaxAge time.Duration
	// MinWindow ignores reports measured over less time than this: too noisy. Default 100 ms.
	MinWindow time.Duration
}

func (c *EstimatorConfig) fill() {
	if c.HalfLife <= 0 {
		c.HalfLife = 10 * time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 6 * c.HalfLife
	}
	if c.MinWindow <= 0 {
		c.MinWindow = 100 * time.Millisecond
	}
}

// ErrBadReport is wrapped by errors about unusable reports.
var ErrBadReport = errors.New("load: bad report")

// Estimator folds nodes' load reports into an estimate of each slice's load. It keeps the
// latest report of each node; at each Fold, every slice that a fresh report covers moves
// towards what its holders report, by an amount that grows with the time since the last
// fold, and every other slice keeps its last estimate.
//
// Only the reports of nodes that hold a slice count for it. So while a slice moves, the node
// that gave it up no longer counts it, and until the new holder reports it the slice keeps its
// estimate, which the map attributes to the new holder: moves in flight count where they go,
// and nothing is counted twice.
//
// Estimator is not safe for concurrent use; it reads no clock (times are arguments).
type Estimator struct {
	cfg      EstimatorConfig
	reports  map[assignment.NodeID]Report
	basis    *assignment.Assignment // the map the estimates are indexed by
	loads    []float64
	keys     []float64
	hot      [][]HotKey
	seen     []bool // the slice has had an estimate
	lastFold time.Time
}

// NewEstimator returns an estimator with no reports.
func NewEstimator(cfg EstimatorConfig) *Estimator {
	cfg.fill()
	return &Estimator{cfg: cfg, reports: map[assignment.NodeID]Report{}}
}

// Add records a node's report, replacing its previous one. An invalid report is refused
// whole, and changes nothing.
func (e *Estimator) Add(r Report) error {
	if err := r.Node.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadReport, err)
	}
	if r.Window <= 0 {
		return fmt.Errorf("%w: window %s; want > 0", ErrBadReport, r.Window)
	}
	for i, s := range r.Samples {
		if err := s.Validate(); err != nil {
			return fmt.Errorf("%w: sample %d: %w", ErrBadReport, i, err)
		}
	}
	for i, k := range r.HotKeys {
		if !finiteNonNegative(k.Load) {
			return fmt.Errorf("%w: hot key %d has load %v; want a finite number >= 0", ErrBadReport, i, k.Load)
		}
	}
	e.reports[r.Node] = r
	return nil
}

// Forget drops a node's report (the node left).
func (e *Estimator) Forget(node assignment.NodeID) { delete(e.reports, node) }

// Estimate is the estimated load, key count and heaviest keys of every slice of a map.
type Estimate struct {
	Loads, Keys []float64
	HotKeys     [][]HotKey
}

// maxHotKeys is how many keys per slice an estimate keeps.
const maxHotKeys = 4

// Fold updates the estimates with the reports and returns them for the slices of a. now is
// the time of the fold.
func (e *Estimator) Fold(a *assignment.Assignment, now time.Time) Estimate {
	e.rebase(a)
	n := a.Len()
	share := make([]float64, n)                                 // sum of the shares reported by holders
	keys := make([]float64, n)                                  // sum of the key counts reported by holders
	reporters := make([]int32, n)                               // holders that reported
	last := make([]int32, n)                                    // 1 + the last report that counted for the slice
	hot := make([][]HotKey, n)                                  // summed over reporters, scaled below
	for ri, node := range slices.Sorted(maps.Keys(e.reports)) { // sorted: Fold is deterministic
		r := e.reports[node]
		if now.Sub(r.At) > e.cfg.MaxAge || r.Window < e.cfg.MinWindow {
			continue
		}
		hint := 0 // samples usually come in key order: search from the last one
		for _, s := range r.Samples {
			width := s.Range.Width()
			hint = lookupFrom(a, s.Range.Start, hint)
			for i := hint; i < n; i++ {
				sl := a.Slice(i)
				overlap, ok := sl.Range.Intersect(s.Range)
				if !ok {
					break
				}
				if !sl.Holds(node) {
					continue
				}
				f := overlap.Width() / width
				share[i] += s.Load * f
				keys[i] += s.Keys * f
				if last[i] != int32(ri)+1 {
					last[i], reporters[i] = int32(ri)+1, reporters[i]+1
				}
			}
		}
		for _, k := range r.HotKeys {
			i, sl := a.Lookup(k.Hash)
			if sl.Holds(node) {
				hot[i] = addHot(hot[i], k)
			}
		}
	}
	alpha := 1.0
	if !e.lastFold.IsZero() {
		alpha = 1 - math.Exp2(-float64(now.Sub(e.lastFold))/float64(e.cfg.HalfLife))
	}
	e.lastFold = now
	for i := range n {
		if reporters[i] == 0 {
			continue // no fresh report: the slice keeps its estimate
		}
		r := float64(len(a.Slice(i).Replicas))
		scale := r / float64(reporters[i]) // holders that did not report served as much
		fresh, freshKeys := share[i]*scale, keys[i]/float64(reporters[i])
		if !e.seen[i] {
			e.loads[i], e.keys[i], e.seen[i] = fresh, freshKeys, true
		} else {
			e.loads[i] += alpha * (fresh - e.loads[i])
			e.keys[i] += alpha * (freshKeys - e.keys[i])
		}
		e.hot[i] = e.hot[i][:0]
		for _, k := range hot[i] {
			e.hot[i] = append(e.hot[i], HotKey{Hash: k.Hash, Load: k.Load * scale})
		}
	}
	return Estimate{Loads: slices.Clone(e.loads), Keys: slices.Clone(e.keys), HotKeys: slices.Clone(e.hot)}
}

// rebase carries the estimates over to the slices of a, by overlap, when the map changed.
func (e *Estimator) rebase(a *assignment.Assignment) {
	if e.basis == a {
		return
	}
	if e.basis == nil {
		e.loads, e.keys = make([]float64, a.Len()), make([]float64, a.Len())
		e.hot, e.seen = make([][]HotKey, a.Len()), make([]bool, a.Len())
		e.basis = a
		return
	}
	loads, err1 := Reproject(e.basis, e.loads, a)
	keys, err2 := Reproject(e.basis, e.keys, a)
	if err := errors.Join(err1, err2); err != nil {
		panic(fmt.Sprintf("load: estimates built from validated reports are invalid: %v", err))
	}
	seen := make([]bool, a.Len())
	hot := make([][]HotKey, a.Len())
	for i, s := range e.basis.All() {
		if !e.seen[i] {
			continue
		}
		for j, _ := a.Lookup(s.Range.Start); j < a.Len() && a.Slice(j).Range.Overlaps(s.Range); j++ {
			seen[j] = true
		}
		for _, k := range e.hot[i] {
			j, _ := a.Lookup(k.Hash)
			hot[j] = addHot(hot[j], k)
		}
	}
	e.basis, e.loads, e.keys, e.seen, e.hot = a, loads, keys, seen, hot
}

// lookupFrom returns the index of the slice holding point p, looking first just after hint.
func lookupFrom(a *assignment.Assignment, p uint64, hint int) int {
	for i := hint; i < min(hint+4, a.Len()); i++ {
		if a.Slice(i).Range.Contains(p) {
			return i
		}
	}
	i, _ := a.Lookup(p)
	return i
}

// addHot adds k to a heaviest-first list, summing the loads of equal hashes and keeping the
// heaviest maxHotKeys.
func addHot(top []HotKey, k HotKey) []HotKey {
	if i := slices.IndexFunc(top, func(h HotKey) bool { return h.Hash == k.Hash }); i >= 0 {
		k.Load += top[i].Load
		top = slices.Delete(top, i, i+1)
	}
	i, _ := slices.BinarySearchFunc(top, k.Load, func(h HotKey, l float64) int { return cmp.Compare(l, h.Load) })
	top = slices.Insert(top, i, k)
	return top[:min(len(top), maxHotKeys)]
}
