package client

import (
	"slices"
	"sync"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/load"
)

// loadCounter counts the load a node serves, per slice of the map it holds, over a window,
// and keeps a summary of its heaviest keys (Misra-Gries: it never overstates a key's load,
// and finds every key with more than 1/k of the total).
type loadCounter struct {
	mu     sync.Mutex
	list   []Range
	loads  []float64
	hot    map[uint64]float64
	hotCap int
	start  time.Time
}

func newLoadCounter(hotKeys int, now time.Time) *loadCounter {
	return &loadCounter{hot: make(map[uint64]float64, hotKeys), hotCap: hotKeys, start: now}
}

// setSlices changes the slices counted. The load of a slice that stays is kept; a slice that
// is new starts at 0.
func (c *loadCounter) setSlices(list []Range) {
	c.mu.Lock()
	defer c.mu.Unlock()
	loads := make([]float64, len(list))
	j := 0
	for i, r := range list {
		for j < len(c.list) && c.list[j].Start < r.Start {
			j++
		}
		if j < len(c.list) && c.list[j] == r {
			loads[i] = c.loads[j]
		}
	}
	c.list, c.loads = slices.Clone(list), loads
}

// slices returns the slices counted.
func (c *loadCounter) slices() []Range {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.list)
}

// record counts cost against the slice holding hash h; load outside the node's slices (a
// request that came before the node learned it lost a slice) is not counted.
func (c *loadCounter) record(h uint64, cost float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, _ := slices.BinarySearchFunc(c.list, h, func(r Range, h uint64) int {
		if r.Start > h {
			return 1
		}
		return -1
	})
	if i == 0 || !c.list[i-1].Contains(h) {
		return
	}
	c.loads[i-1] += cost
	if c.hotCap == 0 {
		return
	}
	if _, ok := c.hot[h]; ok || len(c.hot) < c.hotCap {
		c.hot[h] += cost
		return
	}
	// Full: every counter, and the newcomer, give up the smallest count (or the cost).
	m := cost
	for _, v := range c.hot {
		m = min(m, v)
	}
	for k, v := range c.hot {
		if v -= m; v <= 0 {
			delete(c.hot, k)
		} else {
			c.hot[k] = v
		}
	}
	if cost > m {
		c.hot[h] = cost - m
	}
}

// take returns the report of the window that ends at now, and starts the next one.
func (c *loadCounter) take(node string, now time.Time) load.Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := load.Report{Node: assignment.NodeID(node), At: now, Window: now.Sub(c.start), Samples: make([]load.Sample, len(c.list))}
	for i, rg := range c.list {
		r.Samples[i] = load.Sample{Range: rg.keyspace(), Load: c.loads[i]}
		c.loads[i] = 0
	}
	for h, v := range c.hot {
		r.HotKeys = append(r.HotKeys, load.HotKey{Hash: h, Load: v})
	}
	slices.SortFunc(r.HotKeys, func(a, b load.HotKey) int {
		switch {
		case a.Load > b.Load:
			return -1
		case a.Load < b.Load:
			return 1
		}
		return 0
	})
	clear(c.hot)
	c.start = now
	return r
}

// holds reports whether h lies in one of the slices counted.
func (c *loadCounter) holds(h uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, _ := slices.BinarySearchFunc(c.list, h, func(r Range, h uint64) int {
		if r.Start > h {
			return 1
		}
		return -1
	})
	return i > 0 && c.list[i-1].Contains(h)
}
