package heatmap

import (
	"fmt"
	"math"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Bounds on a query's grid: more than a screen's pixels buys nothing.
const (
	MaxWidth  = 2000
	MaxHeight = 1000
)

// Query asks for a grid of the history: W columns over the columns From..To (0: the oldest,
// the newest), H rows over the hash range Range. The grid carries every layer, whichever the
// page colours by; with Node set, its Role layer says that node's role in each row.
type Query struct {
	From, To uint64
	Range    keyspace.Range
	W, H     int
	Node     assignment.NodeID
}

// Grid is a query's answer, row r of output column c at index c*H+r.
type Grid struct {
	From, To uint64
	// Seqs and Times are the column each output column shows, and its time.
	Seqs  []uint64
	Times []time.Time
	// Load is the load per unit of key space: a row's load over the fraction of the space it
	// covers. MaxLoad is its largest value.
	Load    []float64
	MaxLoad float64
	// Holder is the index in Nodes of the row's dominant holder (the primary if it has one),
	// -1 for none.
	Holder []int
	// Role, with Query.Node: 1 where it is the primary, 2 where it holds the row otherwise,
	// 0 elsewhere. Without: 1 where the row has a primary.
	Role  []uint8
	Nodes []string
}

// Rasterize answers q from the columns the ring holds.
func (h *History) Rasterize(q Query) (Grid, error) {
	if q.W < 1 || q.W > MaxWidth || q.H < 1 || q.H > MaxHeight {
		return Grid{}, fmt.Errorf("%w: a grid of %d×%d: want 1..%d columns and 1..%d rows", ErrInvalid, q.W, q.H, MaxWidth, MaxHeight)
	}
	if !q.Range.Valid() {
		return Grid{}, fmt.Errorf("%w: range %s is empty", ErrInvalid, q.Range)
	}
	b := h.Bounds()
	from, to := max(q.From, b.First), q.To
	if to == 0 || to > b.Last {
		to = b.Last
	}
	if h.n > 0 && from > to {
		return Grid{}, fmt.Errorf("%w: columns %d..%d: the history holds %d..%d", ErrInvalid, q.From, q.To, b.First, b.Last)
	}
	g := Grid{From: from, To: to, Load: make([]float64, q.W*q.H), Holder: make([]int, q.W*q.H), Role: make([]uint8, q.W*q.H),
		Nodes: append([]string(nil), h.names[1:]...)}
	for i := range g.Holder {
		g.Holder[i] = -1
	}
	node, _ := h.index[q.Node]
	if q.Node == "" {
		node = noNode
	}
	lo, width := float64(q.Range.Start), q.Range.Width()
	for c := range q.W {
		col := h.find(from + uint64(float64(to-from)*float64(c)/float64(max(q.W-1, 1))+0.5))
		if col == nil {
			g.Seqs, g.Times = append(g.Seqs, 0), append(g.Times, time.Time{})
			continue
		}
		g.Seqs, g.Times = append(g.Seqs, col.seq), append(g.Times, time.UnixMilli(col.at))
		r := raster{col: col, lo: lo, step: width / float64(q.H), node: node, byNode: q.Node != ""}
		r.fill(g.Load[c*q.H:(c+1)*q.H], g.Holder[c*q.H:(c+1)*q.H], g.Role[c*q.H:(c+1)*q.H])
	}
	for _, l := range g.Load {
		g.MaxLoad = math.Max(g.MaxLoad, l)
	}
	return g, nil
}

// raster fills the rows of one output column from one recorded column.
type raster struct {
	col      *column
	lo, step float64
	node     uint16
	byNode   bool
}

const space = 1 << 64 // the size of the key space, as a float

// cellEnd returns where cell i of c ends, as a float.
func cellEnd(c *column, i int) float64 {
	if i+1 < len(c.start) {
		return float64(c.start[i+1])
	}
	return space
}

func (r raster) fill(load []float64, holder []int, role []uint8) {
	c, i := r.col, 0
	for row := range load {
		top, bottom := r.lo+float64(row)*r.step, r.lo+float64(row+1)*r.step
		for i+1 < len(c.start) && cellEnd(c, i) <= top {
			i++
		}
		var sum, best float64
		bestCell := -1
		last := row == len(load)-1
		for j := i; j < len(c.start) && (float64(c.start[j]) < bottom || last); j++ {
			s, e := float64(c.start[j]), cellEnd(c, j)
			if e <= s { // narrower than a float's step: a point, all in this row
				if s >= top {
					sum += float64(c.load[j])
				}
				continue
			}
			overlap := math.Min(e, bottom) - math.Max(s, top)
			if overlap <= 0 {
				continue
			}
			sum += float64(c.load[j]) * overlap / (e - s)
			if overlap > best {
				best, bestCell = overlap, j
			}
		}
		if bestCell < 0 {
			continue
		}
		load[row] = sum / ((bottom - top) / space)
		holder[row], role[row] = r.describe(bestCell)
	}
}

// describe returns the dominant holder of cell j (index into Grid.Nodes) and its role value.
func (r raster) describe(j int) (int, uint8) {
	c := r.col
	hs := c.holder[j*holders : (j+1)*holders]
	pos := c.meta[j] & 3
	dominant := hs[0]
	if pos != noPrimary {
		dominant = hs[pos]
	}
	var role uint8
	switch {
	case !r.byNode && pos != noPrimary:
		role = 1
	case r.byNode && r.node != noNode:
		for k, id := range hs {
			if id == r.node {
				role = 2
				if uint8(k) == pos {
					role = 1
				}
			}
		}
	}
	return int(dominant) - 1, role
}

// Replica is a holder of a cell and its role: "primary", "secondary" (in a cluster with
// roles), "replica" (without) or "loading".
type Replica struct {
	Node string
	Role string
}

// Cell is what a column holds at one point.
type Cell struct {
	Seq    uint64
	At     time.Time
	Range  keyspace.Range
	Slices int
	Load   float64
	// Replicas are the holders of the cell's widest slice; More counts those not kept.
	Replicas []Replica
	More     int
}

// CellAt returns the cell of column seq (the newest at or before it) that holds point p.
func (h *History) CellAt(seq uint64, p uint64) (Cell, error) {
	c := h.find(seq)
	if c == nil || len(c.start) == 0 {
		return Cell{}, fmt.Errorf("%w: no column at or before %d", ErrInvalid, seq)
	}
	i := 0
	for i+1 < len(c.start) && c.start[i+1] <= p {
		i++
	}
	end := keyspace.End
	if i+1 < len(c.start) {
		end = keyspace.At(c.start[i+1])
	}
	out := Cell{Seq: c.seq, At: time.UnixMilli(c.at), Range: keyspace.Range{Start: c.start[i], End: end},
		Slices: int(c.count[i]), Load: float64(c.load[i])}
	pos, kept := c.meta[i]&3, 0
	for k, id := range c.holder[i*holders : (i+1)*holders] {
		if id == noNode {
			continue
		}
		kept++
		role := "replica"
		switch {
		case c.meta[i]&(1<<(2+k)) != 0:
			role = "loading"
		case uint8(k) == pos:
			role = "primary"
		case pos != noPrimary:
			role = "secondary"
		}
		out.Replicas = append(out.Replicas, Replica{Node: h.names[id], Role: role})
	}
	out.More = max(int(c.reps[i])-kept, 0)
	return out, nil
}
