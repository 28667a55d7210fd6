// Package heatmap keeps the recent history of the key space that the web view draws: at each
// balancing pass (and each change of the map) a column of the hashed key space, with the load
// and the holders of each part of it, and the map's changes as events to overlay.
//
// A History is passive and deterministic, like the assigner's core: its owner records into it
// and reads from it, and guards it with a lock if several goroutines do. Its memory is bounded:
// a ring of Config.Columns columns of at most Config.Cells cells each (a map of more slices is
// compacted into cells of equal parts of the space, each the sum of the slices that start in
// it), plus a ring of Config.Events events and the node names they use.
package heatmap

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// ErrInvalid marks a query or a configuration that cannot be served.
var ErrInvalid = errors.New("heatmap: invalid")

// Config bounds a History.
type Config struct {
	// Columns is how many columns the ring keeps: an hour of one-second passes by default.
	Columns int
	// Cells bounds the cells of a column, a power of two; default 512.
	Cells int
	// Events is how many events the ring keeps; default 10,000.
	Events int
}

// Defaults of Config.
const (
	DefaultColumns = 3600
	DefaultCells   = 512
	DefaultEvents  = 10000
)

// holders is how many replicas of a cell a column keeps: the rest are counted.
const holders = 3

// noNode is the node index of an empty holder; maxNodes bounds the names a History interns.
const (
	noNode   = 0
	maxNodes = math.MaxUint16
)

// noPrimary in a cell's meta says no kept holder is the primary.
const noPrimary = 3

// CellBytes is the memory a cell takes: start, load, slices, holders, meta, replica count.
const CellBytes = 8 + 4 + 2 + 2*holders + 1 + 1

// Validate says whether a History can be made with c (zero fields taking the defaults).
func (c Config) Validate() error { return c.fill() }

func (c *Config) fill() error {
	if c.Columns == 0 {
		c.Columns = DefaultColumns
	}
	if c.Cells == 0 {
		c.Cells = DefaultCells
	}
	if c.Events == 0 {
		c.Events = DefaultEvents
	}
	if c.Columns < 2 || c.Events < 1 {
		return fmt.Errorf("%w: %d columns and %d events: want at least 2 and 1", ErrInvalid, c.Columns, c.Events)
	}
	if c.Cells < 1 || c.Cells > 1<<16 || bits.OnesCount(uint(c.Cells)) != 1 {
		return fmt.Errorf("%w: %d cells: want a power of two up to 65536", ErrInvalid, c.Cells)
	}
	return nil
}

// column is the key space at one time: cells in order of their starts, each covering the
// space up to the next one's start (the last, up to the end of the space).
type column struct {
	seq    uint64
	at     int64 // Unix ms
	slices int
	start  []uint64
	load   []float32
	count  []uint16 // slices in the cell, at most MaxUint16
	// holders per cell: node index + 1, noNode for none; those of the cell's widest slice.
	holder []uint16
	// meta per cell: bits 0-1 the position of the primary among the holders (noPrimary:
	// none), bits 2-4 which holders are loading.
	meta []uint8
	reps []uint8 // replicas of the widest slice, at most 255
}

// History is the ring of columns and events. The zero value is not usable: call New.
type History struct {
	cfg    Config
	cols   []column // ring; cols[(first+i)%len] is the i-th oldest
	first  int
	n      int
	next   uint64 // seq of the next column; seqs start at 1
	names  []string
	index  map[assignment.NodeID]uint16
	events []Event // ring
	evFst  int
	evN    int
}

// New returns an empty History bounded by cfg (zero fields take the defaults).
func New(cfg Config) (*History, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	// The rings grow as they fill: an assigner with fast passes asks for many columns.
	return &History{cfg: cfg, next: 1, names: []string{""}, index: map[assignment.NodeID]uint16{}}, nil
}

// Config returns the bounds the History was made with, defaults filled in.
func (h *History) Config() Config { return h.cfg }

// Record adds a column for the map a at time at, loads[i] being the load of a's slice i, and
// returns its sequence number. The oldest column makes room when the ring is full.
func (h *History) Record(at time.Time, a *assignment.Assignment, loads []float64) uint64 {
	c := h.slot(min(a.Len(), h.cfg.Cells))
	c.seq, c.at, c.slices = h.next, at.UnixMilli(), a.Len()
	h.next++
	shift := 64 - bits.TrailingZeros(uint(h.cfg.Cells))
	var widest float64
	for i, s := range a.All() {
		bucket := uint64(0)
		if shift < 64 {
			bucket = s.Range.Start >> shift
		}
		n := len(c.start)
		if n == 0 || (shift < 64 && c.start[n-1]>>shift != bucket) {
			c.start = append(c.start, s.Range.Start)
			c.load, c.count = append(c.load, 0), append(c.count, 0)
			c.holder = append(c.holder, make([]uint16, holders)...)
			c.meta, c.reps = append(c.meta, noPrimary), append(c.reps, 0)
			widest, n = -1, n+1
		}
		if i < len(loads) {
			c.load[n-1] += float32(loads[i])
		}
		if c.count[n-1] < math.MaxUint16 {
			c.count[n-1]++
		}
		if w := s.Range.Width(); w > widest {
			widest = w
			h.hold(c, n-1, s)
		}
	}
	return c.seq
}

// slot returns the column to record into, emptied, with room for cells cells: its arrays are
// reused, or made to measure, so that the ring's memory is what its cells need.
func (h *History) slot(cells int) *column {
	var c *column
	if len(h.cols) < h.cfg.Columns {
		h.cols = append(h.cols, column{})
		c = &h.cols[len(h.cols)-1]
		h.n++
	} else {
		c = &h.cols[h.first]
		h.first = (h.first + 1) % len(h.cols)
	}
	if cap(c.start) < cells || cap(c.start) > 2*cells {
		*c = column{start: make([]uint64, 0, cells), load: make([]float32, 0, cells), count: make([]uint16, 0, cells),
			holder: make([]uint16, 0, cells*holders), meta: make([]uint8, 0, cells), reps: make([]uint8, 0, cells)}
	}
	c.start, c.load, c.count, c.holder, c.meta, c.reps = c.start[:0], c.load[:0], c.count[:0], c.holder[:0], c.meta[:0], c.reps[:0]
	return c
}

// hold makes slice s the holders of cell i of c.
func (h *History) hold(c *column, i int, s assignment.Slice) {
	meta := uint8(noPrimary)
	for k := range holders {
		c.holder[i*holders+k] = noNode
		if k >= len(s.Replicas) {
			continue
		}
		id := s.Replicas[k]
		c.holder[i*holders+k] = h.intern(id)
		if id == s.Primary {
			meta = meta&^3 | uint8(k)
		}
		if s.IsLoading(id) {
			meta |= 1 << (2 + k)
		}
	}
	if s.Primary != "" && meta&3 == noPrimary && len(s.Replicas) > holders {
		// Keep the primary among the holders: it is the replica a reader most wants named.
		c.holder[i*holders+holders-1] = h.intern(s.Primary)
		meta = meta&^3 | uint8(holders-1)
	}
	c.meta[i], c.reps[i] = meta, uint8(min(len(s.Replicas), math.MaxUint8))
}

// intern returns the index + 1 of a node's name, noNode once maxNodes names are known.
func (h *History) intern(id assignment.NodeID) uint16 {
	if i, ok := h.index[id]; ok {
		return i
	}
	if len(h.names) >= maxNodes {
		return noNode
	}
	i := uint16(len(h.names))
	h.names = append(h.names, string(id))
	h.index[id] = i
	return i
}

// Bounds says what the ring holds: the first and last sequence numbers and their times (all
// zero when it is empty), and how many columns.
type Bounds struct {
	First, Last         uint64
	FirstTime, LastTime time.Time
	Columns             int
}

// Bounds returns what the ring holds.
func (h *History) Bounds() Bounds {
	if h.n == 0 {
		return Bounds{}
	}
	f, l := h.col(0), h.col(h.n-1)
	return Bounds{First: f.seq, Last: l.seq, FirstTime: time.UnixMilli(f.at), LastTime: time.UnixMilli(l.at), Columns: h.n}
}

// col returns the i-th oldest column.
func (h *History) col(i int) *column { return &h.cols[(h.first+i)%len(h.cols)] }

// find returns the newest column with a seq at or before seq, or nil if none.
func (h *History) find(seq uint64) *column {
	if h.n == 0 || seq < h.col(0).seq {
		return nil
	}
	// Seqs grow but may jump (a history restored after a failover misses what its last leader
	// did not persist): search, do not compute.
	i := sort.Search(h.n, func(i int) bool { return h.col(i).seq > seq })
	return h.col(i - 1)
}

// Bytes returns the memory the History's data takes (its arrays' capacity), without the
// Go headers of its few slices.
func (h *History) Bytes() int {
	total := 0
	for i := range h.cols {
		c := &h.cols[i]
		total += 8*cap(c.start) + 4*cap(c.load) + 2*cap(c.count) + 2*cap(c.holder) + cap(c.meta) + cap(c.reps)
	}
	for _, n := range h.names {
		total += len(n) + 16 + 24 // the name, its string header, its index entry
	}
	for i := range h.events {
		total += eventBytes(&h.events[i])
	}
	return total
}
