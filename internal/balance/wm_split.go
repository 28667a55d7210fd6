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
	var hot []int
	for i, s := range p.sl {
		if s.load > limit && !s.pinned {
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
