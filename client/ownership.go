package client

import (
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

// appCall is one call of the application: Acquire or ChangeRole of rng in grant, or Release
// of rng.
type appCall struct {
	id    uint64 // numbers the calls of one ownership, from 1
	kind  callKind
	rng   keyspace.Range
	grant Grant
	// demotes says the call ends a primary grant the application holds: a release, a
	// demotion, or a promotion to a new token (after a merge) of points it holds as primary.
	// Writes under the old grant end before it starts, and none starts until it returned.
	demotes bool
	since   time.Time // when it was started
	// cancelled says the map took the range, or the role it makes, away while the call ran:
	// its failure is no failure of the application's.
	cancelled bool
}

// promotes reports whether the call makes the application primary (a release has no grant).
func (c appCall) promotes() bool { return c.grant.Role == RolePrimary }

// retried reports whether the call, failed, is tried again after a backoff: an acquire or a
// promotion. A release or a demotion is done whatever the application answers.
func (c appCall) retried() bool { return c.kind == callAcquire || c.promotes() }

// attrs returns the log attributes of the call, answered at now: what it was ("call", and
// "kind" acquire, release or change), its range as hexadecimal points ("from", and "to", ""
// for the end of the space), the grant it makes ("role", "token"), whether it took the
// primary role away ("demotes"), when it started and how long it took.
func (c appCall) attrs(now time.Time) []any {
	to := ""
	if !c.rng.End.IsEnd() {
		to = fmt.Sprintf("%016x", c.rng.End.Point())
	}
	role := ""
	if c.grant.Role != 0 {
		role = c.grant.Role.String()
	}
	kind := map[callKind]string{callAcquire: "acquire", callRelease: "release", callChangeRole: "change"}[c.kind]
	return []any{"call", c.String(), "kind", kind, "from", fmt.Sprintf("%016x", c.rng.Start), "to", to, "role", role,
		"token", c.grant.Token, "demotes", c.demotes, "started", c.since, "took", now.Sub(c.since)}
}

func (c appCall) String() string {
	switch c.kind {
	case callAcquire:
		return fmt.Sprintf("acquire %s as %s", c.rng, c.grant)
	case callRelease:
		return fmt.Sprintf("release %s", c.rng)
	}
	return fmt.Sprintf("change %s to %s", c.rng, c.grant)
}

// granted is a run of points the map gives the member in one grant.
type granted struct {
	r     keyspace.Range
	grant Grant
}

// seg is a run of points that the map gives the member, or that its application holds, or
// that a call is about, alike in all four: the grant the map gives them (want; the zero
// Grant for none), the grant the application holds them in (held; zero for none), the call
// in flight about them (0 for none), and when a failed acquire or promotion of them may be
// tried again (zero: none failed).
type seg struct {
	r       keyspace.Range
	want    Grant
	held    Grant
	call    uint64
	retryAt time.Time
}

// alike reports whether s and t differ in their range only.
func (s seg) alike(t seg) bool {
	return s.want == t.want && s.held == t.held && s.call == t.call && s.retryAt.Equal(t.retryAt)
}

// idle reports whether s is nothing to the member: not given, not held, no call about it.
func (s seg) idle() bool { return s.want.Role == 0 && s.held.Role == 0 && s.call == 0 }

// kind returns the call that would bring s's points to their grant, and its urgency (lower
// first: 0 for none): a demotion first, as the successor's promotion waits for it (a release
// of points held as primary is one), then a promotion, then an acquire, then a release.
func (s seg) kind() (callKind, int) {
	switch {
	case s.held == s.want:
		return 0, 0
	case s.want.Role == 0 && s.held.Role == RolePrimary:
		return callRelease, 1
	case s.want.Role == 0:
		return callRelease, 4
	case s.held.Role == 0:
		return callAcquire, 3
	case s.want.Role == RolePrimary:
		return callChangeRole, 2
	}
	return callChangeRole, 1
}

// ownership reconciles what the map gives a member with what its application holds. It is
// passive and deterministic, as the assigner's core is: the member's loop steps in the
// member's ranges of each map (setMap), the application's answers (done) and the time, and
// asks it for the calls to make (next), up to limit at once.
//
// Its state is a sorted list of segments, each a run of points alike in what the map gives,
// what the application holds and the call about them; every step costs O(segments), the
// member's share of the map, whatever the number of calls. Calls in flight are about
// disjoint points, so the application may make them in parallel: every point sees its calls
// one at a time, in order. A call's range is a maximal run of adjacent points needing the
// same call: a split or merge of slices the member holds calls nothing, and a call may cover
// part of an earlier call's range, or several. An Acquire that fails holds nothing, and is
// tried again after a backoff while the map still gives the range; meanwhile the range counts
// as loading, so the assigner does not count the member as serving it.
type ownership struct {
	segs  []seg
	gen   uint64              // of the last map
	calls map[uint64]*appCall // in flight, by id
	last  uint64              // the id of the last call started
	limit int                 // calls in flight at once, at most
	// backoff is the wait after the next failed acquire or promotion.
	backoff time.Duration
}

// Bounds of the backoff between failed acquires.
const (
	minAcquireBackoff = 100 * time.Millisecond
	maxAcquireBackoff = 10 * time.Second
)

// newOwnership returns an ownership that makes at most limit calls at once (at least one).
func newOwnership(limit int) *ownership {
	return &ownership{calls: map[uint64]*appCall{}, limit: max(limit, 1), backoff: minAcquireBackoff}
}

// setMap takes the member's ranges of the map of generation gen, sorted and disjoint, at
// now. It returns the calls in flight to cancel: an acquire or promotion of points the map no
// longer gives, or a promotion of points it no longer gives as that primary. An acquire in
// another role than the map gives now goes on: it is the change of role that follows. A new
// map brings a failed acquire or promotion forward to the least backoff: what made it fail
// (an old holder to load from that died) may have changed with the map, and a backoff grown
// to seconds would keep the range from everyone for as long.
func (o *ownership) setMap(want []granted, gen uint64, now time.Time) (cancel []uint64) {
	newMap := gen != o.gen
	o.gen = gen
	o.segs = overlay(o.segs, want)
	for i := range o.segs {
		if s := &o.segs[i]; newMap && s.retryAt.After(now.Add(minAcquireBackoff)) {
			s.retryAt = now.Add(minAcquireBackoff)
		}
	}
	for _, s := range o.segs {
		c := o.calls[s.call]
		if c == nil || c.cancelled || !c.retried() {
			continue
		}
		if s.want.Role == 0 || c.promotes() && s.want != c.grant {
			c.cancelled = true
			cancel = append(cancel, c.id)
		}
	}
	return cancel
}

// overlay returns the segments of old with the grants of want: every point of either, its
// want from want (none where want has none: what the map took away is not tried again)
// and the rest from old, coalesced.
func overlay(old []seg, want []granted) []seg {
	bounds := make([]keyspace.Bound, 0, 2*(len(old)+len(want)))
	for _, s := range old {
		bounds = append(bounds, keyspace.At(s.r.Start), s.r.End)
	}
	for _, w := range want {
		bounds = append(bounds, keyspace.At(w.r.Start), w.r.End)
	}
	slices.SortFunc(bounds, keyspace.Bound.Compare)
	bounds = slices.Compact(bounds)
	out := make([]seg, 0, len(bounds))
	i, j := 0, 0
	for k := 0; k+1 < len(bounds); k++ {
		p := bounds[k].Point() // only the last bound can be the end of the space
		for i < len(old) && !old[i].r.End.After(p) {
			i++
		}
		for j < len(want) && !want[j].r.End.After(p) {
			j++
		}
		var s seg
		if i < len(old) && old[i].r.Contains(p) {
			s = old[i]
		}
		s.want = Grant{}
		if j < len(want) && want[j].r.Contains(p) {
			s.want = want[j].grant
		}
		if s.want.Role == 0 || s.want == s.held {
			s.retryAt = time.Time{} // nothing left to try again
		}
		if s.idle() {
			continue
		}
		s.r = keyspace.Range{Start: p, End: bounds[k+1]}
		out = append(out, s)
	}
	return coalesce(out)
}

// coalesce joins adjacent segments that are alike, and drops idle ones, in place.
func coalesce(segs []seg) []seg {
	out := segs[:0]
	for _, s := range segs {
		if s.idle() {
			continue
		}
		if n := len(out); n > 0 && out[n-1].alike(s) && out[n-1].r.End == keyspace.At(s.r.Start) {
			out[n-1].r.End = s.r.End
			continue
		}
		out = append(out, s)
	}
	return out
}

// done takes the application's answer to call id at now: nil, or the error it failed with. An
// acquire that failed (or was cancelled) holds nothing; a promotion that failed leaves the
// points in their old grant; both are tried again after a backoff while the map still wants
// them. A release or a demotion is done whatever it says (the application answers for what
// it holds, and must not go on acting as primary).
func (o *ownership) done(id uint64, err error, now time.Time) {
	c := o.calls[id]
	if c == nil {
		return
	}
	delete(o.calls, id)
	failed := err != nil && c.retried() && !c.cancelled
	for i := range o.segs {
		s := &o.segs[i]
		if s.call != id {
			continue
		}
		s.call = 0
		switch {
		case c.kind == callRelease:
			s.held = Grant{}
		case err != nil && c.retried() && c.cancelled:
			// Cancelled, as the map took the range away: nothing failed.
		case failed:
			s.retryAt = now.Add(o.backoff)
		default: // an acquire or a role change that succeeded, or a demotion
			s.held, s.retryAt = c.grant, time.Time{}
		}
	}
	o.segs = coalesce(o.segs)
	switch {
	case failed:
		o.backoff = min(2*o.backoff, maxAcquireBackoff)
	case !slices.ContainsFunc(o.segs, func(s seg) bool { return !s.retryAt.IsZero() }):
		o.backoff = minAcquireBackoff
	}
}

// next returns the calls to make at now, most urgent first (see seg.kind), up to the limit
// of calls in flight, and marks them in flight. An acquire or promotion that failed is not
// tried again before its retryAt.
func (o *ownership) next(now time.Time) []appCall {
	var out []appCall
	for urgency := 1; urgency <= 4 && len(o.calls) < o.limit; urgency++ {
		for i := 0; i < len(o.segs) && len(o.calls) < o.limit; {
			n := o.run(i, urgency, now)
			if n == 0 {
				i++
				continue
			}
			out = append(out, o.start(i, n, now))
			i += n
		}
	}
	return out
}

// run returns how many segments from i on make one call of the given urgency at now: a run
// of adjacent ones free of calls that need the same call to the same grant; 0 if segment i
// needs no such call now.
func (o *ownership) run(i, urgency int, now time.Time) int {
	due := func(s seg) bool {
		kind, u := s.kind()
		gated := (kind == callAcquire || s.want.Role == RolePrimary) && now.Before(s.retryAt)
		return u == urgency && s.call == 0 && !gated
	}
	first := o.segs[i]
	if !due(first) {
		return 0
	}
	kind, _ := first.kind()
	n := 1
	for ; i+n < len(o.segs); n++ {
		s, prev := o.segs[i+n], o.segs[i+n-1]
		if k, _ := s.kind(); !due(s) || k != kind || s.want != first.want || prev.r.End != keyspace.At(s.r.Start) {
			break
		}
	}
	return n
}

// start marks the n segments from i in flight in one call, and returns it.
func (o *ownership) start(i, n int, now time.Time) appCall {
	o.last++
	first, end := o.segs[i], o.segs[i+n-1].r.End
	kind, _ := first.kind()
	c := &appCall{id: o.last, kind: kind, rng: keyspace.Range{Start: first.r.Start, End: end}, grant: first.want, since: now}
	for k := i; k < i+n; k++ {
		o.segs[k].call = c.id
		c.demotes = c.demotes || o.segs[k].held.Role == RolePrimary && o.segs[k].held != c.grant
	}
	o.calls[c.id] = c
	return *c
}

// free reports how many more calls may be in flight.
func (o *ownership) free() int { return o.limit - len(o.calls) }

// wake returns when the first failed acquire or promotion is due again, if one waits.
func (o *ownership) wake() (time.Time, bool) {
	var first time.Time
	for _, s := range o.segs {
		if s.retryAt.IsZero() || s.call != 0 {
			continue
		}
		if first.IsZero() || s.retryAt.Before(first) {
			first = s.retryAt
		}
	}
	return first, !first.IsZero()
}

// ranges returns the ranges of the segments that keep, adjacent ones joined.
func (o *ownership) ranges(keep func(seg) bool) []keyspace.Range {
	var out []keyspace.Range
	for _, s := range o.segs {
		if !keep(s) {
			continue
		}
		if n := len(out); n > 0 && out[n-1].End == keyspace.At(s.r.Start) {
			out[n-1].End = s.r.End
			continue
		}
		out = append(out, s.r)
	}
	return out
}

// loading returns the points the map gives that the application does not hold yet: the
// assigner must not count the member as serving them. A point that changes role is served
// meanwhile, in its old role.
func (o *ownership) loading() []keyspace.Range {
	return o.ranges(func(s seg) bool { return s.want.Role != 0 && s.held.Role == 0 })
}

// holding returns the points the application holds, in any role.
func (o *ownership) holding() []keyspace.Range {
	return o.ranges(func(s seg) bool { return s.held.Role != 0 })
}

// given returns the points the map gives the member, in any role.
func (o *ownership) given() []keyspace.Range {
	return o.ranges(func(s seg) bool { return s.want.Role != 0 })
}

// primaries returns the points the member reports holding as primary: those the application
// holds as primary, and those of a call in flight that makes it primary (it may act as one
// before the call returns). The assigner promotes another member of a point only once the
// report leaves it out (I10).
func (o *ownership) primaries() []primaryRange {
	var out []primaryRange
	for _, s := range o.segs {
		token, ok := s.held.Token, s.held.Role == RolePrimary
		if c := o.calls[s.call]; c != nil && c.promotes() {
			token, ok = c.grant.Token, true
		}
		if !ok {
			continue
		}
		if n := len(out); n > 0 && out[n-1].token == token && out[n-1].r.End == keyspace.At(s.r.Start) {
			out[n-1].r.End = s.r.End
			continue
		}
		out = append(out, primaryRange{r: s.r, token: token})
	}
	return out
}

// serving returns the grant in which the application serves each of its points now, and the
// one the map gives them if it is another: what
// it holds, but none from the start of a release, and secondary from the moment the map
// takes a primary grant away (a demotion, or a new token after a merge), queued or under
// way, until the call that makes the next grant returned: requests wait for none of these
// calls. An acquire or promotion counts once it returned.
func (o *ownership) serving() []served {
	var out []served
	for _, s := range o.segs {
		g, next := s.held, Grant{}
		switch c := o.calls[s.call]; {
		case c != nil && c.kind == callRelease:
			g = Grant{}
		case g.Role == RolePrimary && (s.want != g || c != nil && c.demotes):
			g = Grant{Role: RoleSecondary}
		}
		if s.want.Role != 0 && s.want != g {
			next = s.want
		}
		if g.Role == 0 && next.Role == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].grant == g && out[n-1].next == next && out[n-1].r.End == keyspace.At(s.r.Start) {
			out[n-1].r.End = s.r.End
			continue
		}
		out = append(out, served{r: s.r, grant: g, next: next})
	}
	return out
}

// served is a run of points the application serves in one grant (the zero Grant: none), and
// the grant the map gives them while the call that makes it is due or under way (zero: none):
// a request that the first cannot take and the second can waits for it.
type served struct {
	r     keyspace.Range
	grant Grant
	next  Grant
}

// primaryRange is a range held as primary, with the token of its grant.
type primaryRange struct {
	r     keyspace.Range
	token uint64
}
