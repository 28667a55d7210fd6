package core

import (
	"fmt"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Leases, the assigner's side (Config.Exclusive, --exclusive). In an exclusive cluster a
// member holds the primary roles the map gives it only while its lease is valid: its
// registration and each heartbeat the assigner accepts renew it for NodeTTL, counted by the
// member from when it sent the request (less its drift margin) and by the assigner from
// when it received it, so that the member's count ends first. The assigner gives a primary
// role to another member only once the old primary gave it up (promote: its heartbeat no
// longer claims it) or once the old primary's lease ran out on the assigner's clock:
//
//   - a primary that departs, is dropped or loads again while its lease runs is not
//     replaced until the lease ends (pending);
//   - a primary that does not demote within HandoffTimeout is no longer renewed (withheld),
//     and its successor is promoted once its lease ends (forcePromotion);
//   - a primary whose lease ran out while it stays registered (refused or withheld
//     renewals) is replaced at once: it has demoted itself, or will find its writes fenced;
//   - a new leader does not know what its predecessor granted last: every stored node's
//     lease runs a full NodeTTL from its taking office, and no slice without a primary gets
//     one before that (hold).
//
// A heartbeat that claims a primary role the map does not give the member, or a token above
// the map's, is refused whole: it renews nothing.
type leases struct {
	until   map[assignment.NodeID]time.Time // on the assigner's clock; kept past a node's departure
	pending []pendingRole
	hold    time.Time
}

// pendingRole is a range whose primary role was taken from a member that did not give it up,
// and may not go to another before until.
type pendingRole struct {
	from  assignment.NodeID
	r     keyspace.Range
	until time.Time
}

// exclusive reports whether primaries hold leases.
func (c *Core) exclusive() bool { return c.cfg.Exclusive }

// takeOfficeLeases starts a new leader's leases: every stored node's lease, and the hold on
// slices without a primary, run a full NodeTTL from now, if there is a map (before the
// first, nobody was granted anything).
func (c *Core) takeOfficeLeases(now time.Time) {
	c.leases = leases{until: map[assignment.NodeID]time.Time{}}
	if !c.exclusive() || c.a == nil {
		return
	}
	c.leases.hold = now.Add(c.cfg.NodeTTL)
	for id := range c.nodes {
		c.leases.until[id] = c.leases.hold
	}
}

// renew renews node id's lease at now and returns its length; 0 when the cluster is not
// exclusive or the renewal is withheld.
func (c *Core) renew(id assignment.NodeID, now time.Time) time.Duration {
	if !c.exclusive() || c.withheld(id, now) {
		return 0
	}
	c.leases.until[id] = now.Add(c.cfg.NodeTTL)
	return c.cfg.NodeTTL
}

// generation returns the map's generation, 0 before the first map.
func (c *Core) generation() uint64 {
	if c.a == nil {
		return 0
	}
	return c.a.Generation()
}

// leaseValid reports whether node id may act as a primary at now, by the assigner's count.
func (c *Core) leaseValid(id assignment.NodeID, now time.Time) bool {
	return !c.exclusive() || now.Before(c.leases.until[id])
}

// withheld reports whether node id's renewal is withheld at now: it is the primary of a
// slice whose successor has served for HandoffTimeout and it has not handed the role over.
func (c *Core) withheld(id assignment.NodeID, now time.Time) bool {
	for _, i := range c.ho.slices {
		s := c.a.Slice(i)
		if s.Primary == id && s.Next != "" && !now.Before(c.ho.served[s.Since].Add(c.cfg.HandoffTimeout)) {
			return true
		}
	}
	return false
}

// checkClaims refuses a heartbeat of an exclusive cluster that claims a primary role the map
// does not give its member, or a token above the map's (a token below it is a view that
// lags, after a merge for one).
func (c *Core) checkClaims(hb Heartbeat) error {
	if !c.exclusive() || c.a == nil {
		return nil
	}
	if len(hb.Tokens) != len(hb.Primaries) {
		return fmt.Errorf("%w: %d primary ranges but %d tokens", ErrInvalid, len(hb.Primaries), len(hb.Tokens))
	}
	for k, r := range hb.Primaries {
		i, _ := c.a.Lookup(r.Start)
		for ; i < c.a.Len(); i++ {
			s := c.a.Slice(i)
			if !s.Range.Overlaps(r) {
				break
			}
			switch {
			case s.Primary != hb.Node:
				return fmt.Errorf("%w: node %s claims the primary role of %s, which the map gives to %q: demote it",
					ErrPrecondition, hb.Node, s.Range, s.Primary)
			case hb.Tokens[k] > s.Token:
				return fmt.Errorf("%w: node %s claims token %d for %s, above the map's %d",
					ErrInvalid, hb.Node, hb.Tokens[k], s.Range, s.Token)
			}
		}
	}
	return nil
}

// mayGrant reports whether the primary role of r may go to node to at now, as a slice that
// has no primary: after a new leader's hold, and once every member it was taken from
// without giving it up is past its lease.
func (c *Core) mayGrant(r keyspace.Range, to assignment.NodeID, now time.Time) bool {
	if !c.exclusive() {
		return true
	}
	if now.Before(c.leases.hold) {
		return false
	}
	for _, p := range c.leases.pending {
		if p.from != to && p.r.Overlaps(r) && now.Before(p.until) {
			return false
		}
	}
	return true
}

// lapse records that the primary role of r was taken from node from, which did not give it
// up: it goes to no other before from's lease ends. It reports whether the role must wait.
func (c *Core) lapse(from assignment.NodeID, r keyspace.Range, now time.Time) bool {
	until := c.leases.until[from]
	if !c.exclusive() || !now.Before(until) {
		return false
	}
	p := pendingRole{from: from, r: r, until: until}
	if !slices.Contains(c.leases.pending, p) {
		c.leases.pending = append(c.leases.pending, p)
	}
	return true
}

// leaseDeadline returns when a lease that a primary role waits for ends, if any.
func (c *Core) leaseDeadline(now time.Time) (time.Time, bool) {
	var first time.Time
	earliest := func(t time.Time) {
		if t.After(now) && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	if !c.exclusive() {
		return first, false
	}
	earliest(c.leases.hold)
	for _, p := range c.leases.pending {
		earliest(p.until)
	}
	for _, i := range c.ho.slices {
		if s := c.a.Slice(i); s.Primary != "" && s.Next != "" {
			earliest(c.leases.until[s.Primary])
		}
	}
	return first, !first.IsZero()
}

// leaseRoles proposes the roles the map must have now that leases may have ended, or returns
// nil: slices without a primary get one, primaries whose lease ran out are replaced.
func (c *Core) leaseRoles(now time.Time) (*change, error) {
	if !c.exclusive() || c.a == nil {
		return nil, nil
	}
	c.leases.pending = slices.DeleteFunc(c.leases.pending, func(p pendingRole) bool { return !now.Before(p.until) })
	for id, until := range c.leases.until {
		if _, ok := c.nodes[id]; !ok && !now.Before(until) {
			delete(c.leases.until, id)
		}
	}
	if c.a.Validate(c.holders()) != nil {
		return nil, nil // departed nodes wait for the clean-up, which places the roles too
	}
	ops := c.placeRoles(c.a, c.a, now)
	if len(ops) == 0 {
		return nil, nil
	}
	ch, err := c.changeMap(ops, nil, fmt.Sprintf("leases: the primary roles of %d slices", len(ops)), now)
	if err != nil {
		return nil, fmt.Errorf("assigner: placing primaries after leases: %w", err)
	}
	ch.summary = ch.quantum.Cause
	return ch, nil
}
