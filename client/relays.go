package client

import (
	"maps"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// relayRetry is how long a router leaves a relay alone after a watch of it failed: it
// watches the next relay in its ranking, or the assigner, meanwhile.
const relayRetry = 10 * time.Second

// relayHeartbeat is how often a router asks a relay for a heartbeat on an idle watch, and
// relayIdleTimeout how long it waits on a silent one. Every idle watch costs its relay a
// message per heartbeat: at 2 s instead of the 500 ms a watch of the leader has, a relay
// serving thousands of routers sends a quarter of the messages. A relay that dies closes
// its connections and is left at once; only one that hangs takes the longer timeout.
const (
	relayHeartbeat   = 2 * time.Second
	relayIdleTimeout = 4 * relayHeartbeat
)

// warmSpread is the time over which a router connects ahead of need to its next relay,
// after it starts watching one: at a random point within it, so that the routers a relay's
// end moved all at once do not all make a TLS handshake with their next relay at once.
// Made at once, those handshakes kept the relays' cores busy for seconds, and the relays'
// other watchers, hearing nothing, took them for dead too. Spread over 5 s, the handshakes
// of the 2,000 routers a relay's kill moved, and of those whose next relay it was, still
// saturated two cores for seconds after the kill (issue 24's fleet test at 6,000 routers).
const warmSpread = 30 * time.Second

// relays are the relays a router may watch the map from: the distributors, which the map's
// stream itself names (a reinitializing quantum carries their set). A router ranks them by
// rendezvous hashing on its ID, as nodes are spread over distributors, so that routers spread
// evenly, and a relay that goes moves only its own routers. They are owned by the watch
// loop.
type relays struct {
	self   string
	dialer func(addr string) (*grpc.ClientConn, error)
	set    quantum.Distributors
	ranked []string                          // the set's IDs, best first
	conns  map[string]*grpc.ClientConn       // by relay ID, dialled at its address in set when first chosen
	failed map[string]time.Time              // relay ID -> when it may be tried again
	warmOf string                            // the relay watched, whose next one is kept connected; "" for none
	warmAt time.Time                         // when to connect it; zero once connected
	warmed string                            // the relay connected ahead of need
	jitter func(time.Duration) time.Duration // a random duration in [0, d)
}

func newRelays(self string, dialer func(string) (*grpc.ClientConn, error)) *relays {
	return &relays{self: self, dialer: dialer, conns: map[string]*grpc.ClientConn{}, failed: map[string]time.Time{},
		jitter: func(d time.Duration) time.Duration { return rand.N(d) }}
}

// update records the set a quantum carried; the connections of relays gone or moved are
// closed, and the relays that failed are tried again: a relay that restarted registers anew.
func (rs *relays) update(set quantum.Distributors) {
	if set == nil || maps.Equal(set, rs.set) {
		return
	}
	clear(rs.failed)
	for id, conn := range rs.conns {
		if set[id] != rs.set[id] {
			_ = conn.Close()
			delete(rs.conns, id)
		}
	}
	rs.set, rs.ranked = set, set.Rank(rs.self)
}

// preferred returns the ID of the relay to watch at now: the first in the ranking not left
// alone after a failure; "" for the assigner.
func (rs *relays) preferred(now time.Time) string {
	for _, id := range rs.ranked {
		if now.After(rs.failed[id]) {
			return id
		}
	}
	return ""
}

// watching records that the router watches relay id from now on: the relay after it is
// connected ahead of need at a random point within warmSpread (see tick).
func (rs *relays) watching(id string, now time.Time) {
	rs.warmOf, rs.warmAt, rs.warmed = id, now.Add(rs.jitter(warmSpread)), ""
}

// tick connects the next relay once its time has come, and again, at a random point within
// warmSpread, whenever that connection went idle: gRPC leaves a connection idle when its
// relay restarted, and closes one unused for its idle timeout (30 minutes), and a router
// that connected only once would meet its next relay's end with no connection at all.
func (rs *relays) tick(now time.Time) {
	switch {
	case rs.warmOf == "":
	case rs.warmAt.IsZero():
		if c := rs.conns[rs.warmed]; c != nil && c.GetState() == connectivity.Idle {
			rs.warmAt = now.Add(rs.jitter(warmSpread))
		}
	case !now.Before(rs.warmAt):
		rs.warmed, rs.warmAt = rs.warm(rs.warmOf, now), time.Time{}
	}
}

// warm connects, ahead of need, to the relay after id in the ranking, not left alone after a
// failure, and returns its ID ("" for none): when id goes, its routers move there all at
// once, and a TLS handshake each, all at that moment, would keep the relay's cores busy for
// seconds.
func (rs *relays) warm(id string, now time.Time) string {
	for i, cand := range rs.ranked {
		if cand != id {
			continue
		}
		for _, next := range rs.ranked[i+1:] {
			if now.After(rs.failed[next]) {
				c, err := rs.conn(next)
				if err != nil {
					return ""
				}
				c.Connect()
				return next
			}
		}
	}
	return ""
}

// conn returns the connection to relay id, dialling it if needed.
func (rs *relays) conn(id string) (*grpc.ClientConn, error) {
	if c, ok := rs.conns[id]; ok {
		return c, nil
	}
	c, err := rs.dialer(rs.set[id])
	if err != nil {
		return nil, err
	}
	rs.conns[id] = c
	return c, nil
}

// fail leaves relay id alone until relayRetry after now.
func (rs *relays) fail(id string, now time.Time) { rs.failed[id] = now.Add(relayRetry) }

func (rs *relays) close() {
	for _, c := range rs.conns {
		_ = c.Close()
	}
}

// relayDialer dials relays with the router's TLS: their certificates name distributors.
func (r *Router) relayDialer(addr string) (*grpc.ClientConn, error) {
	return dial.Peer(addr, append(dial.Target(r.cfg.Target), r.tls.DialOption("distributor"))...)
}
