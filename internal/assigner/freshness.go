package assigner

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// freshness keeps what each node said in its last heartbeat about its pull stream: whether
// its data may be behind the source. It is a signal for operators (and later for serving
// rules); the map does not depend on it.
type freshness struct {
	stale prometheus.Gauge

	mu      sync.Mutex
	nodes   map[assignment.NodeID]nodeFreshness
	counted time.Time // when stale was last recomputed
}

type nodeFreshness struct {
	stale   bool
	silence time.Duration // 0 if the node never heard from a distributor
	at      time.Time     // of the heartbeat that said it
}

func newFreshness(reg prometheus.Registerer) *freshness {
	f := &freshness{nodes: map[assignment.NodeID]nodeFreshness{},
		stale: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sliceplane", Subsystem: "assigner", Name: "nodes_stale",
			Help: "Registered nodes that said in their last heartbeat that their data may be stale (their pull stream is silent)."})}
	reg.MustRegister(f.stale)
	return f
}

// record keeps what node id said at now; entries older than ttl (their node expired or left)
// are dropped when the gauge is recomputed, at most once a second.
func (f *freshness) record(id assignment.NodeID, stale bool, silence time.Duration, now time.Time, ttl time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, had := f.nodes[id]
	f.nodes[id] = nodeFreshness{stale: stale, silence: silence, at: now}
	if now.Sub(f.counted) < time.Second {
		if had && old.stale != stale || !had && stale {
			f.stale.Set(float64(f.countLocked(now, ttl)))
		}
		return
	}
	f.counted = now
	for n, e := range f.nodes {
		if now.Sub(e.at) > ttl {
			delete(f.nodes, n)
		}
	}
	f.stale.Set(float64(f.countLocked(now, ttl)))
}

func (f *freshness) countLocked(now time.Time, ttl time.Duration) int {
	n := 0
	for _, e := range f.nodes {
		if e.stale && now.Sub(e.at) <= ttl {
			n++
		}
	}
	return n
}

// of returns what node id last said, if it said anything within ttl.
func (f *freshness) of(id assignment.NodeID, now time.Time, ttl time.Duration) (nodeFreshness, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.nodes[id]
	return e, ok && now.Sub(e.at) <= ttl
}
