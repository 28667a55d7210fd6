package core

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// The role models a cluster may have (Config.Roles, --roles). Primaries need
// make-before-break: a primary hands its role over while its successor serves.
const (
	RolesReplicas         = assignment.RolesReplicas
	RolesPrimarySecondary = assignment.RolesPrimarySecondary
)

// Roles, the assigner's side (see assignment/roles.go for the map's). With
// RolesPrimarySecondary every change of the map is followed, in the same quantum, by the
// Assigns that give each slice the roles it must have (placeRoles): the primary stays where
// it is while it is a serving replica that stays; one that leaves (a move, a drain, a pass
// that drops its replica: the drop of a live primary lingers as a move does, see
// assignment.Handoff) hands the role over gracefully: once a replica that stays serves the slice, it is named Next and the
// primary demotes itself (its member's application stops taking writes); when its heartbeat
// no longer lists the slice among the ranges it holds as primary, Next is promoted (promote).
// Meanwhile the old primary does not drop the slice: its handoff lingers until the
// promotion, or until HandoffTimeout after the new holders served, when the promotion is
// forced (the member may be hung; in a cluster without leases, a live old primary may then
// still act as one). A primary that departed or was dropped is replaced at once, by Next if
// there is one. A participant that does not report roles (a storage node of the data path)
// needs no demotion: the role moves at once. A new primary goes to the serving replica that
// holds the fewest primaries, the first by ID on a tie.

// withRoles returns ops followed by the Assigns that give the map they lead to the roles it
// must have; ops as they are in a cluster without roles.
func (c *Core) withRoles(ops []assignment.Op, now time.Time) ([]assignment.Op, error) {
	if !c.roles.Primaries || len(ops) == 0 {
		return ops, nil
	}
	mid, ops, err := c.a.Resolve(ops) // a Handoff as its Assign, so that roles fold into it
	if err != nil {
		return nil, err // changeMap says which
	}
	return foldRoles(ops, c.placeRoles(c.a, mid, now)), nil
}

// foldRoles returns ops followed by roles, a role's Assign folded into the last Assign of ops
// to the same slice when ops only assign (no split or merge moves a slice's start), so that a
// quantum carries each slice once.
func foldRoles(ops, roles []assignment.Op) []assignment.Op {
	last := map[uint64]int{}
	for i, op := range ops {
		a, ok := op.(assignment.Assign)
		if !ok {
			return append(ops, roles...)
		}
		last[a.Slice] = i
	}
	out := slices.Clone(ops)
	for _, op := range roles {
		r := op.(assignment.Assign)
		if i, ok := last[r.Slice]; ok {
			out[i] = r
			continue
		}
		out = append(out, r)
	}
	return out
}

// placeRoles returns the Assigns that give every slice of after the roles it must have at
// now, after before (nil: none had any). A slice of after keeps the roles it has (the ops set
// them, or left it alone); one without takes those of the slice of before that holds its
// start (the two maps are walked together). A primary other than before's is a new grant:
// it takes the next token, the generation of the map these Assigns make, plus one.
func (c *Core) placeRoles(before, after *assignment.Assignment, now time.Time) []assignment.Op {
	counts := map[assignment.NodeID]int{}
	for _, s := range after.All() {
		if s.Primary != "" {
			counts[s.Primary]++
		}
	}
	var ops []assignment.Op
	j, grant := 0, after.Generation()+1
	if before == after { // these Assigns make the map after's next generation
		grant++
	}
	for _, s := range after.All() {
		was, old := s, assignment.NodeID("") // roles the ops set, or kept; before's primary
		if before != nil {
			for before.Slice(j).Range.End.Compare(keyspace.At(s.Range.Start)) <= 0 && !before.Slice(j).Range.End.IsEnd() {
				j++
			}
			if old = before.Slice(j).Primary; s.Primary == "" {
				was = before.Slice(j)
			}
		}
		p, n := c.rolesOf(was, s, counts, now)
		token := s.Token
		if p != "" && p != old {
			token = grant
		}
		if p == s.Primary && n == s.Next && token == s.Token {
			continue
		}
		if s.Primary != "" {
			counts[s.Primary]--
		}
		if p != "" {
			counts[p]++
		}
		ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: s.Replicas, Loading: s.Loading,
			Leaving: s.Leaving, Since: s.Since, Primary: p, Next: n, Token: token})
	}
	return ops
}

// rolesOf returns the primary and next primary slice s must have at now, the roles of was
// (the slice it was part of) being what they were.
func (c *Core) rolesOf(was, s assignment.Slice, counts map[assignment.NodeID]int, now time.Time) (primary, next assignment.NodeID) {
	serving := slices.DeleteFunc(slices.Clone(s.Replicas), func(id assignment.NodeID) bool {
		return s.IsLoading(id) || id == assignment.Nobody // a quarantined slice has no primary
	})
	staying := slices.DeleteFunc(slices.Clone(serving), func(id assignment.NodeID) bool { return slices.Contains(s.Leaving, id) })
	p, n := was.Primary, was.Next
	if p == "" || !slices.Contains(serving, p) || !c.leaseValid(p, now) {
		// None, or it departed, was dropped, loads again, or its lease ran out. One that did
		// not give the role up keeps it from others until its lease ends (exclusive.go).
		if p != "" && c.lapse(p, s.Range, now) {
			return "", ""
		}
		if n != "" && slices.Contains(serving, n) && c.leaseValid(n, now) && c.mayGrant(s.Range, n, now) {
			return n, ""
		}
		return c.candidate(s.Range, serving, counts, now), ""
	}
	if !slices.Contains(s.Leaving, p) {
		return p, "" // it stays: a handover it had begun is called off
	}
	if n != "" && slices.Contains(staying, n) {
		return p, n // the handover goes on
	}
	n = fewest(slices.DeleteFunc(staying, func(id assignment.NodeID) bool { return id == p }), counts)
	switch {
	case n == "":
		return p, "" // the new holders load: it stays primary meanwhile
	case !c.reportsRoles(p):
		return n, "" // nothing to wait for: it does not act on roles
	}
	return p, n
}

// candidate returns the serving replica that may become the primary of r at now and holds
// the fewest primaries, "" for none: in an exclusive cluster one with a valid lease, once
// the range may be granted.
func (c *Core) candidate(r keyspace.Range, serving []assignment.NodeID, counts map[assignment.NodeID]int, now time.Time) assignment.NodeID {
	if !c.exclusive() {
		return fewest(serving, counts)
	}
	id := fewest(slices.DeleteFunc(slices.Clone(serving), func(id assignment.NodeID) bool { return !c.leaseValid(id, now) }), counts)
	if id == "" || !c.mayGrant(r, id, now) {
		return ""
	}
	return id
}

// fewest returns the node of ids holding the fewest primaries, the first on a tie; "" for
// none.
func fewest(ids []assignment.NodeID, counts map[assignment.NodeID]int) assignment.NodeID {
	var best assignment.NodeID
	for _, id := range ids {
		if best == "" || counts[id] < counts[best] {
			best = id
		}
	}
	return best
}

// reportsRoles reports whether node id reports the ranges it holds as primary (a member
// whose application acts on roles), so that a handover waits for its demotion.
func (c *Core) reportsRoles(id assignment.NodeID) bool {
	n, ok := c.nodes[id]
	return ok && n.Roles != ""
}

// withPrimaries returns the initial map a with a primary for each slice.
func (c *Core) withPrimaries(a *assignment.Assignment, now time.Time) (*assignment.Assignment, error) {
	if !c.roles.Primaries {
		return a, nil
	}
	next, err := a.Apply(c.placeRoles(nil, a, now))
	if err != nil {
		return nil, fmt.Errorf("assigner: the initial primaries: %w", err)
	}
	return next.WithGeneration(a.Generation()), nil
}

// promote returns the Assigns that promote Next wherever hb's node is a demoting primary that
// no longer holds the slice as primary, as of a map that named Next (or reports no roles).
func (c *Core) promote(hb Heartbeat) []assignment.Op {
	var ops []assignment.Op
	for _, i := range c.ho.slices {
		s := c.a.Slice(i)
		if s.Primary != hb.Node || s.Next == "" {
			continue
		}
		// A member that acts on roles has demoted itself once a heartbeat from a map that
		// names Next (it no longer makes itself primary) leaves the slice out.
		if c.reportsRoles(hb.Node) && (hb.Generation < c.ho.named[s.Range.Start].gen || overlapsAny(hb.Primaries, s.Range)) {
			continue
		}
		ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: s.Replicas, Loading: s.Loading,
			Leaving: s.Leaving, Since: s.Since, Primary: s.Next})
	}
	return ops
}

// claim is a range a member's last heartbeat said it holds as primary, with the token.
type claim struct {
	r     keyspace.Range
	token uint64
}

// noteClaims records what hb's node claims to hold as primary, if it acts on roles: a
// lingering slice's old primary lets go only once the new one has claimed the role.
func (c *Core) noteClaims(hb Heartbeat) {
	if !c.reportsRoles(hb.Node) {
		return
	}
	claims := make([]claim, len(hb.Primaries))
	for i, r := range hb.Primaries {
		claims[i] = claim{r: r}
		if i < len(hb.Tokens) {
			claims[i].token = hb.Tokens[i]
		}
	}
	if c.claims == nil {
		c.claims = map[assignment.NodeID][]claim{}
	}
	c.claims[hb.Node] = claims
}

// claimedBy reports whether node id's last heartbeat claimed all of s as primary, with s's
// grant or a later one.
func (c *Core) claimedBy(id assignment.NodeID, s assignment.Slice) bool {
	return slices.ContainsFunc(c.claims[id], func(k claim) bool {
		return k.token >= s.Token && k.r.Start <= s.Range.Start && s.Range.End.Compare(k.r.End) <= 0
	})
}

// awaitsClaim reports whether lingering slice s keeps its leaving replicas until its primary
// claims the role: a member that acts on roles, which is not leaving, hands nothing over,
// and has not claimed it yet.
func (c *Core) awaitsClaim(s assignment.Slice) bool {
	return s.Primary != "" && s.Next == "" && !slices.Contains(s.Leaving, s.Primary) && c.reportsRoles(s.Primary) &&
		!c.claimedBy(s.Primary, s)
}

// claimed returns the Assigns that end the lingering of the slices that node id, as its
// heartbeat now claims, holds as primary, if they lingered long enough: their leaving
// replicas let go.
func (c *Core) claimed(id assignment.NodeID, now time.Time) []assignment.Op {
	var ops []assignment.Op
	for start, since := range c.ho.unclaimed {
		i, ok := c.a.Find(start)
		if !ok {
			continue
		}
		s := c.a.Slice(i)
		if s.Primary != id || !c.claimedBy(id, s) {
			continue
		}
		delete(c.ho.unclaimed, start)
		if !now.Before(c.ho.served[since].Add(c.cfg.HandoffLinger)) && !demoting(s) {
			ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: s.Target()})
		}
	}
	slices.SortFunc(ops, func(a, b assignment.Op) int {
		return cmp.Compare(a.(assignment.Assign).Slice, b.(assignment.Assign).Slice)
	})
	return ops
}

// demoting reports whether a lingering slice waits for its primary to hand over: the primary
// is leaving, with a successor named or not.
func demoting(s assignment.Slice) bool {
	return s.Next != "" || s.Primary != "" && slices.Contains(s.Leaving, s.Primary)
}

// forcePromotion returns the Assign that promotes s's Next without waiting for the old
// primary's demotion, once HandoffTimeout has passed since its new holders served and, in
// an exclusive cluster, the old primary's lease has ended (its renewals are withheld from
// the timeout on).
func (c *Core) forcePromotion(s assignment.Slice, now time.Time) (assignment.Assign, bool) {
	if s.Next == "" || now.Before(c.ho.served[s.Since].Add(c.cfg.HandoffTimeout)) || c.exclusive() && c.leaseValid(s.Primary, now) {
		return assignment.Assign{}, false
	}
	return assignment.Assign{Slice: s.Range.Start, Replicas: s.Replicas, Loading: s.Loading, Leaving: s.Leaving,
		Since: s.Since, Primary: s.Next}, true
}
