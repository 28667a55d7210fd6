package client

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// callKind is what an application call does.
type callKind uint8

const (
	callAcquire callKind = iota + 1
	callRelease
	callChangeRole
)

// appCall is one call of the application: Acquire or ChangeRole of Range in Grant, or
// Release.
type appCall struct {
	kind  callKind
	rng   keyspace.Range
	grant Grant
	since time.Time // when it was started
	// cancelled says the map took the range away while the call ran: its failure is no
	// failure of the application's.
	cancelled bool
}

// promotes reports whether the call makes the application primary (a release has no grant).
func (c appCall) promotes() bool { return c.grant.Role == RolePrimary }

// retried reports whether the call, failed, is tried again after a backoff: an acquire or a
// promotion. A release or a demotion is done whatever the application answers.
func (c appCall) retried() bool { return c.kind == callAcquire || c.promotes() }

func (c appCall) String() string {
	switch c.kind {
	case callAcquire:
		return fmt.Sprintf("acquire %s as %s", c.rng, c.grant)
	case callRelease:
		return fmt.Sprintf("release %s", c.rng)
	}
	return fmt.Sprintf("change %s to %s", c.rng, c.grant)
}

// ownership reconciles what the map gives a member with what its application holds. It is
// passive and deterministic, as the assigner's core is: the member's loop steps in the
// member's ranges of each map (setMap), the application's answers (done) and the time, and
// asks it for the next call to make (next), one at a time, so that the application sees its
// calls in order, from one goroutine.
//
// Ranges are sets of points, not slices: a split or merge of slices the member holds calls
// nothing, and a call's range is a maximal run of points gained, lost or changing role, which
// may cover part of an earlier call's range, or several. An Acquire that fails holds nothing,
// and is tried again after a backoff while the map still gives the range; meanwhile the range
// counts as loading, so the assigner does not count the member as serving it.
type ownership struct {
	want map[Grant]keyspace.Set // by the last map
	gen  uint64                 // of the last map
	held map[Grant]keyspace.Set // what the application holds: acquired, not released
	busy *appCall               // the call in flight
	// retryAt is when acquires that failed are tried again; backoff the wait after the next
	// failure.
	retryAt time.Time
	backoff time.Duration
	failed  keyspace.Set // the points whose last acquire failed
}

// Bounds of the backoff between failed acquires.
const (
	minAcquireBackoff = 100 * time.Millisecond
	maxAcquireBackoff = 10 * time.Second
)

func newOwnership() *ownership {
	return &ownership{want: map[Grant]keyspace.Set{}, held: map[Grant]keyspace.Set{}, backoff: minAcquireBackoff}
}

// setMap takes the member's ranges, by role, of the map of generation gen. It reports
// whether the call in flight should be cancelled: an acquire of points the map no longer
// gives in that role.
func (o *ownership) setMap(want map[Grant]keyspace.Set, gen uint64) (cancel bool) {
	o.want, o.gen = want, gen
	o.failed = o.failed.Intersect(union(want)) // what the map took away is not retried
	if o.busy == nil || o.busy.kind == callRelease || o.busy.cancelled {
		return false
	}
	r := keyspace.NewSet(o.busy.rng)
	o.busy.cancelled = !r.Minus(o.want[o.busy.grant]).Empty()
	return o.busy.cancelled
}

// done takes the application's answer to the call in flight at now: nil, or the error it
// failed with. An acquire that failed (or was cancelled) holds nothing; a promotion that
// failed leaves the points in their old grant; both are tried again after a backoff while
// the map still wants them. A release or a demotion is done whatever it says (the
// application answers for what it holds, and must not go on acting as primary).
func (o *ownership) done(err error, now time.Time) {
	c := o.busy
	o.busy = nil
	if c == nil {
		return
	}
	r := keyspace.NewSet(c.rng)
	switch {
	case c.kind == callRelease:
		for g, h := range o.held {
			o.held[g] = h.Minus(r)
		}
	case err != nil && c.retried() && c.cancelled:
		// Cancelled, as the map took the range away: nothing failed.
	case err != nil && c.retried():
		o.failed = o.failed.Union(r)
		o.retryAt = now.Add(o.backoff)
		o.backoff = min(2*o.backoff, maxAcquireBackoff)
	default: // an acquire or a role change that succeeded, or a demotion
		for g, h := range o.held {
			o.held[g] = h.Minus(r)
		}
		o.held[c.grant] = o.held[c.grant].Union(r)
		o.failed = o.failed.Minus(r)
		if o.failed.Empty() {
			o.backoff = minAcquireBackoff
		}
	}
}

// next returns the next call to make at now, if one is due and none is in flight, and marks
// it in flight: releases first (what the map no longer gives in any role), then role
// changes, then acquires (promotions and acquires that failed not before retryAt).
func (o *ownership) next(now time.Time) (appCall, bool) {
	if o.busy != nil {
		return appCall{}, false
	}
	all := union(o.want)
	if r, ok := first(union(o.held).Minus(all)); ok {
		return o.start(appCall{kind: callRelease, rng: r, since: now}), true
	}
	for _, g := range grants(o.want) {
		// Points held in another role, or with another token: they change role.
		change := o.want[g].Intersect(union(o.held).Minus(o.held[g]))
		if g.Role == RolePrimary && now.Before(o.retryAt) {
			change = change.Minus(o.failed)
		}
		if r, ok := first(change); ok {
			return o.start(appCall{kind: callChangeRole, rng: r, grant: g, since: now}), true
		}
	}
	for _, g := range grants(o.want) {
		gained := o.want[g].Minus(union(o.held))
		if now.Before(o.retryAt) {
			gained = gained.Minus(o.failed)
		}
		if r, ok := first(gained); ok {
			return o.start(appCall{kind: callAcquire, rng: r, grant: g, since: now}), true
		}
	}
	return appCall{}, false
}

func (o *ownership) start(c appCall) appCall {
	o.busy = &c
	return c
}

// wake returns when a failed acquire or promotion is due again, if one waits.
func (o *ownership) wake() (time.Time, bool) {
	var notYet keyspace.Set // points the map wants in a grant they are not held in
	for g, s := range o.want {
		notYet = notYet.Union(s.Minus(o.held[g]))
	}
	return o.retryAt, !notYet.Intersect(o.failed).Empty() && o.busy == nil
}

// loading returns the points the map gives that the application does not hold yet: the
// assigner must not count the member as serving them. A point that changes role is served
// meanwhile, in its old role.
func (o *ownership) loading() keyspace.Set { return union(o.want).Minus(union(o.held)) }

// primaries returns the points the member reports holding as primary: those the application
// holds as primary, and those of a call in flight that makes it primary (it may act as one
// before the call returns). The assigner promotes another member of a point only once the
// report leaves it out (I10).
func (o *ownership) primaries() []primaryRange {
	var out []primaryRange
	for _, g := range grants(o.held) {
		if g.Role == RolePrimary {
			for _, r := range o.held[g].Ranges() {
				out = append(out, primaryRange{r: r, token: g.Token})
			}
		}
	}
	if c := o.busy; c != nil && c.promotes() {
		out = append(out, primaryRange{r: c.rng, token: c.grant.Token})
	}
	return out
}

// primaryRange is a range held as primary, with the token of its grant.
type primaryRange struct {
	r     keyspace.Range
	token uint64
}

// pointsOf returns the points of rs.
func pointsOf(rs []primaryRange) keyspace.Set {
	var out keyspace.Set
	for _, p := range rs {
		out = out.Union(keyspace.NewSet(p.r))
	}
	return out
}

// holding returns the points the application holds, in any role.
func (o *ownership) holding() keyspace.Set { return union(o.held) }

// union returns the points of every set of m.
func union(m map[Grant]keyspace.Set) keyspace.Set {
	var out keyspace.Set
	for _, s := range m {
		out = out.Union(s)
	}
	return out
}

// grants returns the grants of m, in order, for a deterministic choice.
func grants(m map[Grant]keyspace.Set) []Grant {
	out := make([]Grant, 0, len(m))
	for g := range m {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b Grant) int {
		if c := cmp.Compare(a.Role, b.Role); c != 0 {
			return c
		}
		return cmp.Compare(a.Token, b.Token)
	})
	return out
}

// first returns the first range of s.
func first(s keyspace.Set) (keyspace.Range, bool) {
	if s.Empty() {
		return keyspace.Range{}, false
	}
	return s.Ranges()[0], true
}
