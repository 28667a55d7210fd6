package assigner

import (
	"sync"

	"golang.org/x/time/rate"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// DefaultReportsPerSecond is how many load reports a member may send its target's leader a
// second (Config.MaxReportsPerSecond): twenty times a client's default report interval.
const DefaultReportsPerSecond = 20

// maxGated bounds the members a gate remembers: past it, it forgets them all (their next
// reports get a full burst), so that reports naming ever new members cannot grow it.
const maxGated = 100_000

// reportGate drops the load reports of a member that reports more often than its rate, at
// the API, before they reach the target's leader loop: a member that floods its leader
// costs the loop, and so its target's passes and the other calls it serves, nothing past
// its rate. A report dropped is one load sample lost; the next one is as good.
type reportGate struct {
	every rate.Limit // 0: no limit
	burst int

	mu     sync.Mutex
	limits map[assignment.NodeID]*rate.Limiter
}

// newReportGate returns a gate of perSecond reports a member, a burst of twice that; none
// for perSecond <= 0.
func newReportGate(perSecond float64) *reportGate {
	if perSecond <= 0 {
		return &reportGate{}
	}
	return &reportGate{every: rate.Limit(perSecond), burst: max(int(2*perSecond), 1), limits: map[assignment.NodeID]*rate.Limiter{}}
}

// allow reports whether a report of member id may go on now.
func (g *reportGate) allow(id assignment.NodeID) bool {
	if g.every == 0 {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	l, ok := g.limits[id]
	if !ok {
		if len(g.limits) >= maxGated {
			clear(g.limits)
		}
		l = rate.NewLimiter(g.every, g.burst)
		g.limits[id] = l
	}
	return l.Allow()
}
