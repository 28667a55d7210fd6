package balance

import (
	"cmp"
	"math"
	"slices"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// split cuts slices hotter than SplitAbove times the mean slice load, hottest first, while
// their nodes hold fewer than MaxSlicesPerNode slices.
func (p *wmPass) split() {
	if p.load <= 0 {
		return
	}
	limit := p.cfg.SplitAbove * p.load / float64(len(p.sl))
	z := p.gate(len(p.sl))
	var hot []int
	for i, s := range p.sl {
		if s.load-z*s.unc > limit && !s.pinned {
			hot = append(hot, i)
		}
	}
	slices.SortStableFunc(hot, func(a, b int) int { return cmp.Compare(p.sl[b].load, p.sl[a].load) })
	for _, i := range hot {
		s := &p.sl[i]
		if slices.ContainsFunc(s.reps, func(n int32) bool { return p.count[n] >= p.cfg.MaxSlicesPerNode }) {
			continue
		}
		points := p.splitPoints(s)
		start := s.r.Start
		for _, at := range points {
			p.ops = append(p.ops, assignment.Split{Slice: start, At: at})
			start = at
		}
		for _, n := range s.reps {
			p.count[n] += len(points)
		}
		p.x.Splits += len(points)
	}
}

// splitPoints says where to cut a hot slice: around its hottest key when that key carries at
// least HotKeyShare of the load (a single key can only be spread by replicating it, so it needs
// a slice of its own), else at the estimated load median, else at the middle of its range.
func (p *wmPass) splitPoints(s *wmSlice) []uint64 {
	if p.known && s.keys <= 1 {
		return nil // one key cannot be split; it can only be replicated
	}
	var hot []HotKey
	for _, k := range s.hot {
		if s.r.Contains(k.Hash) && k.Load > 0 {
			hot = append(hot, k)
		}
	}
	slices.SortFunc(hot, func(a, b HotKey) int { return cmp.Compare(a.Hash, b.Hash) })
	if len(hot) > 0 {
		top := slices.MaxFunc(hot, func(a, b HotKey) int { return cmp.Compare(a.Load, b.Load) })
		if top.Load >= p.cfg.HotKeyShare*s.load {
			var pts []uint64
			if top.Hash > s.r.Start {
				pts = append(pts, top.Hash)
			}
			if top.Hash < math.MaxUint64 && s.r.End.After(top.Hash+1) {
				pts = append(pts, top.Hash+1)
			}
			return pts
		}
		if m, ok := loadMedian(s.r, s.load, hot); ok {
			return []uint64{m}
		}
	}
	if m, ok := s.r.Midpoint(); ok {
		return []uint64{m}
	}
	return nil
}

// loadMedian estimates the point that halves a slice's load, taking its hot keys (sorted by
// hash) as point masses and spreading the rest of its load evenly over its range. It returns
// false if the point is not strictly inside the range.
func loadMedian(r keyspace.Range, total float64, hot []HotKey) (uint64, bool) {
	width := r.Width()
	rest := total
	for _, k := range hot {
		rest -= k.Load
	}
	rest = max(rest, 0)
	half := total / 2
	var cum, prev float64 // load so far; offset of the previous hot key
	at := func(off float64) (uint64, bool) {
		p := r.Start + uint64(off)
		return p, p > r.Start && r.End.After(p)
	}
	for _, k := range hot {
		off := float64(k.Hash - r.Start)
		if seg := rest * (off - prev) / width; rest > 0 && cum+seg >= half {
			return at(prev + (half-cum)/rest*width)
		} else {
			cum += seg
		}
		prev = off
		if cum+k.Load >= half {
			// The median falls on this key: cut just before it, or just after it when it
			// is the first point of the range.
			if k.Hash > r.Start {
				return k.Hash, true
			}
			return at(1)
		}
		cum += k.Load
	}
	if rest <= 0 {
		return 0, false
	}
	return at(prev + (half-cum)/rest*width)
}

// cutHotKeys gives every key that needs replicas of its own (it carries at least HotKeyShare
// of its slice's load, and more than ReplicateAbove times the mean node load) a slice of its
// own before the move step, so that the key is replicated in the pass that first sees it
// rather than one pass later. Cutting copies nothing. Only the key's slice is new in kind:
// the pieces around it are ordinary slices and may move like any other.
func (p *wmPass) cutHotKeys() {
	mean := p.meanU()
	if mean <= 0 {
		return
	}
	var out []wmSlice
	for i := range p.sl {
		s := &p.sl[i]
		k, ok := p.keyToCut(s, mean)
		if !ok {
			if out != nil {
				out = append(out, *s)
			}
			continue
		}
		if out == nil {
			out = append(make([]wmSlice, 0, len(p.sl)+2), p.sl[:i]...)
		}
		pieces := p.cut(s, k)
		for _, n := range s.reps {
			p.count[n] += len(pieces) - 1
		}
		p.x.Splits += len(pieces) - 1
		out = append(out, pieces...)
	}
	if out != nil {
		p.sl = out
	}
}

// keyToCut returns the key of s to cut out now, if any.
func (p *wmPass) keyToCut(s *wmSlice, mean float64) (HotKey, bool) {
	if s.pinned || s.load <= 0 || p.oneKey(s) || s.change == moved && len(s.reps) >= p.cfg.MaxReplicas ||
		slices.ContainsFunc(s.reps, func(n int32) bool { return p.count[n] >= p.cfg.MaxSlicesPerNode }) {
		return HotKey{}, false
	}
	var top HotKey
	for _, k := range s.hot {
		if s.r.Contains(k.Hash) && k.Load > top.Load {
			top = k
		}
	}
	if top.Load <= 0 || top.Load < p.cfg.HotKeyShare*s.load || top.Load+p.cfg.NoiseMargin*keySpread(s, top.Load) <= p.cfg.ReplicateAbove*mean {
		return HotKey{}, false
	}
	return top, true
}

// cut splits s around key k into up to three slices on the same replicas, emitting the
// splits. The key's slice carries the key's load; the rest of the load follows the other hot
// keys to their pieces and is otherwise spread over the pieces by width; keys are counted as
// the churn of a pass counts them. The
// pieces around the key stay where they are in this pass, as the halves of any split do.
func (p *wmPass) cut(s *wmSlice, k HotKey) []wmSlice {
	var pieces []wmSlice
	piece := func(r keyspace.Range) wmSlice {
		return wmSlice{r: r, reps: s.reps, pinned: s.pinned, change: s.change}
	}
	if k.Hash > s.r.Start {
		pieces = append(pieces, piece(keyspace.Range{Start: s.r.Start, End: keyspace.At(k.Hash)}))
		p.ops = append(p.ops, assignment.Split{Slice: s.r.Start, At: k.Hash})
	}
	key := len(pieces)
	pieces = append(pieces, piece(keyspace.Range{Start: k.Hash, End: s.r.End}))
	if k.Hash < math.MaxUint64 && s.r.End.After(k.Hash+1) {
		pieces[key].r.End = keyspace.At(k.Hash + 1)
		pieces = append(pieces, piece(keyspace.Range{Start: k.Hash + 1, End: s.r.End}))
		p.ops = append(p.ops, assignment.Split{Slice: k.Hash, At: k.Hash + 1})
	}
	for j := range pieces {
		pieces[j].change = cutAround
	}
	pieces[key].change = s.change
	if s.change == moved {
		// Clean-up or a merge placed it: the key may still gain replicas, but neither move
		// nor lose the copy just made.
		pieces[key].change = placed
	}
	pieces[key].load, pieces[key].hot = k.Load, []HotKey{k}
	for j := range pieces {
		pieces[j].keys = p.keysIn(pieces[j].r)
	}
	spread, restWidth := s.load-k.Load, 0.0
	for _, h := range s.hot {
		if h.Hash != k.Hash && s.r.Contains(h.Hash) {
			spread -= h.Load
		}
	}
	spread = max(spread, 0)
	for j := range pieces {
		if j != key {
			restWidth += pieces[j].r.Width()
		}
	}
	for j := range pieces {
		if j == key {
			continue
		}
		share := pieces[j].r.Width() / restWidth
		pieces[j].load = spread * share
		for _, h := range s.hot {
			if h.Hash != k.Hash && pieces[j].r.Contains(h.Hash) {
				pieces[j].load += h.Load
				pieces[j].hot = append(pieces[j].hot, h)
			}
		}
	}
	for j := range pieces {
		pieces[j].spread = keySpread(s, pieces[j].load)
	}
	// Hot keys may claim more than the slice's load (their estimates are noisier): the nodes
	// then carry the pieces' sum, so that taking a piece off later leaves no residue.
	var sum float64
	for _, pc := range pieces {
		sum += pc.load
	}
	if d := sum - s.load; d != 0 {
		p.load += d
		for _, n := range s.reps {
			p.addLoad(n, d/float64(len(s.reps)))
		}
	}
	return pieces
}

// keySpread is the part of slice s's spread that a piece of it carrying load l takes: the
// spread is measured for the slice alone, and is shared out in proportion to load.
func keySpread(s *wmSlice, l float64) float64 {
	if s.load <= 0 {
		return 0
	}
	return s.spread * min(1, l/s.load)
}
