package client

import (
	"maps"
	"time"

	"google.golang.org/grpc"

	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// relayRetry is how long a router leaves a relay alone after a watch of it failed: it
// watches the next relay in its ranking, or the assigner, meanwhile.
const relayRetry = 10 * time.Second

// relays are the relays a router may watch the map from: the distributors, which the map's
// stream itself names (a reinitializing quantum carries their set). A router ranks them by
// rendezvous hashing on its ID, as nodes are spread over distributors, so that routers spread
// evenly, and a relay that goes moves only its own routers. They are owned by the watch
// loop.
type relays struct {
	self   string
	dialer func(addr string) (*grpc.ClientConn, error)
	set    quantum.Distributors
	ranked []string                    // the set's IDs, best first
	conns  map[string]*grpc.ClientConn // by relay ID, dialled at its address in set when first chosen
	failed map[string]time.Time        // relay ID -> when it may be tried again
}

func newRelays(self string, dialer func(string) (*grpc.ClientConn, error)) *relays {
	return &relays{self: self, dialer: dialer, conns: map[string]*grpc.ClientConn{}, failed: map[string]time.Time{}}
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

// warm connects, ahead of need, to the relay after id in the ranking, not left alone after a
// failure: when id goes, its routers move there all at once, and a TLS handshake each, all
// at that moment, would keep the relay's cores busy for seconds.
func (rs *relays) warm(id string, now time.Time) {
	for i, cand := range rs.ranked {
		if cand != id {
			continue
		}
		for _, next := range rs.ranked[i+1:] {
			if now.After(rs.failed[next]) {
				if c, err := rs.conn(next); err == nil {
					c.Connect()
				}
				return
			}
		}
	}
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
	return dial.Peer(addr, r.tls.DialOption("distributor"))
}
