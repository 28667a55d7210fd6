package core

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// crashLoop is a cluster of simulated members around a core, in virtual time: every member
// heartbeats while it runs, with the generation of the map, which it applies and loads at
// once, and crashes (stops heartbeating, without deregistering) as soon as the map gives it
// the slice holding the poison key. A crashed member restarts, under the same ID, once the
// assigner has dropped it, as a restart that outlasts the lease does.
type crashLoop struct {
	t       *testing.T
	c       *Core
	now     time.Time
	poison  uint64
	members map[assignment.NodeID]*member
	crashes []assignment.NodeID // in the order they crashed
	// disarmed keeps the key harmless (a key that turns deadly later: a bad write, a deploy).
	disarmed bool
	// widest is the most points the quarantine held at once, and found when it first held
	// any (zero: not yet).
	widest uint64
	found  time.Time
}

type member struct {
	up       bool
	nextBeat time.Time
}

const crashLoopTTL = 2 * time.Second

func newCrashLoop(t *testing.T, n int, window time.Duration) *crashLoop {
	c, err := New(Config{NodeTTL: crashLoopTTL, PassInterval: 200 * time.Millisecond, Algorithm: "weighted-move",
		Params: smallParams, QuarantineWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	l := &crashLoop{t: t, c: c, now: t0, poison: keyspace.HashString("key-of-death"), members: map[assignment.NodeID]*member{}}
	l.settle(LeadershipGained{Term: 1})
	for i := range n {
		id := assignment.NodeID(fmt.Sprintf("n%d", i+1))
		l.members[id] = &member{}
		l.start(id)
	}
	return l
}

// settle steps ev and commits its writes, failing the test on an error reply.
func (l *crashLoop) settle(ev Event) {
	l.t.Helper()
	for _, out := range l.c.Settle(l.now, ev) {
		if out.Reply != nil && out.Reply.Err != nil {
			l.t.Fatalf("%T at +%s: %v", ev, l.now.Sub(t0), out.Reply.Err)
		}
	}
	l.crashHolders()
}

func (l *crashLoop) start(id assignment.NodeID) {
	m := l.members[id]
	m.up, m.nextBeat = true, l.now.Add(crashLoopTTL/4)
	l.settle(Register{Node: Node{Node: assignment.Node{ID: id}, Address: string(id) + ":1"}})
}

// crashHolders crashes every running member that the map gives the poison key.
func (l *crashLoop) crashHolders() {
	a, _, _ := l.c.Assignment()
	if a == nil || l.disarmed {
		return
	}
	_, s := a.Lookup(l.poison)
	for _, id := range s.Replicas {
		if m := l.members[id]; m != nil && m.up {
			m.up = false
			l.crashes = append(l.crashes, id)
		}
	}
}

// run advances virtual time by d, in steps of 50 ms: members beat, crashed ones whose lease
// the assigner dropped restart, and the core ticks.
func (l *crashLoop) run(d time.Duration) {
	for end := l.now.Add(d); l.now.Before(end); l.now = l.now.Add(50 * time.Millisecond) {
		for _, id := range slices.Sorted(func(yield func(assignment.NodeID) bool) {
			for id := range l.members {
				if !yield(id) {
					return
				}
			}
		}) {
			m := l.members[id]
			_, registered := l.c.nodes[id]
			switch {
			case !m.up && !registered:
				l.start(id)
			case m.up && !l.now.Before(m.nextBeat):
				m.nextBeat = l.now.Add(crashLoopTTL / 4)
				l.settle(Heartbeat{Node: id, Generation: l.c.generation()})
			}
		}
		l.settle(Tick{})
		l.measure()
	}
}

// runUntil runs until done holds, for at most d; it returns the virtual time it took, and
// whether done held.
func (l *crashLoop) runUntil(d time.Duration, done func() bool) (time.Duration, bool) {
	start := l.now
	for l.now.Sub(start) < d {
		if done() {
			return l.now.Sub(start), true
		}
		l.run(time.Second)
	}
	return l.now.Sub(start), done()
}

// quarantined returns the points the core holds in quarantine.
func (l *crashLoop) quarantined() keyspace.Set {
	var rs []keyspace.Range
	for _, q := range l.c.Status().Quarantined {
		rs = append(rs, q.Range)
	}
	return keyspace.NewSet(rs...)
}

// measure records how wide the quarantine is, and when it was first found.
func (l *crashLoop) measure() {
	q := l.quarantined()
	if q.Empty() {
		return
	}
	if l.found.IsZero() {
		l.found = l.now
	}
	switch n, full := size(q); {
	case full:
		l.widest = math.MaxUint64
	case n > l.widest:
		l.widest = n
	}
}

// narrowed reports whether the quarantine holds the poison key and at most 1/1024 of the key
// space, and no probe is under way.
func (l *crashLoop) narrowed() bool {
	q := l.quarantined()
	n, full := size(q)
	return q.Contains(l.poison) && !full && n <= 1<<54 && len(l.c.qw.probes) == 0
}

// halvings returns how many halvings take the widest quarantine seen to 1/1024 of the space.
func (l *crashLoop) halvings() int {
	h := 0
	for n := l.widest; n > 1<<54; n /= 2 {
		h++
	}
	return h
}

// checkNarrowed runs the loop until the quarantine is narrowed and checks it, then that it
// stays so for a minute, the rest served, with no crash more. It bounds the crashes by two
// to find the key and one per halving, and returns how long narrowing took from the key's
// quarantine.
func (l *crashLoop) checkNarrowed(limit time.Duration) time.Duration {
	l.t.Helper()
	if _, ok := l.runUntil(limit, l.narrowed); !ok {
		l.t.Fatalf("after %s the quarantine is %s (%d probes under way), crashes %v; want at most 1/1024 of the key space, holding the key",
			limit, describe(l.quarantined()), len(l.c.qw.probes), l.crashes)
	}
	took, crashes := l.now.Sub(l.found), len(l.crashes)
	l.run(time.Minute)
	if !l.narrowed() || len(l.crashes) != crashes {
		l.t.Fatalf("the quarantine went on changing (%s) or members crashing (%v)", describe(l.quarantined()), l.crashes)
	}
	l.checkServing()
	if bound := 2 + l.halvings(); crashes > bound {
		l.t.Fatalf("%d crashes (%v); want at most %d, two and one per halving of the widest quarantine", crashes, l.crashes, bound)
	}
	return took
}

// TestCrashLoop runs a key of death on five members, from a cold start, with the quarantine
// guard and without: with it, two members crash, the guard quarantines what they both
// acquired, and narrowing takes it down to 1/1024 of the key space around the key, at the
// cost of a crash per halving at most; the key's range is then held by no node, the rest of
// the map by running members (I12). Without it, the crashes walk from member to member for
// as long as the test runs.
func TestCrashLoop(t *testing.T) {
	const members, horizon = 5, 2 * time.Minute
	counts := map[string]int{}
	for _, tc := range []struct {
		name   string
		window time.Duration
	}{{"guard", 0}, {"no-guard", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			l := newCrashLoop(t, members, tc.window)
			if tc.window < 0 {
				l.run(horizon)
				counts[tc.name] = len(l.crashes)
				t.Logf("%s: %d crashes in %s of virtual time, of members %v", tc.name, len(l.crashes), horizon, uniq(l.crashes))
				// It never stops: each crash hands the key to the emptiest member, often one
				// that has just restarted.
				if crashed := len(uniq(l.crashes)); crashed < 3 || len(l.crashes) < 4*members {
					t.Fatalf("without the guard the key of death crashed %d members %d times; want it to keep walking (>= 3 members, >= %d crashes)",
						crashed, len(l.crashes), 4*members)
				}
				return
			}
			took := l.checkNarrowed(5 * time.Minute)
			counts[tc.name] = len(l.crashes)
			t.Logf("%s: %d crashes (%v); quarantined %.2f%% of the key space at first, narrowed to %s in %s of virtual time",
				tc.name, len(l.crashes), l.crashes, 100*float64(l.widest)/math.Exp2(64), describe(l.quarantined()), took)
		})
	}
	t.Logf("crashes: with the guard %d, without %d in %s", counts["guard"], counts["no-guard"], horizon)
}

// TestCrashLoopAfterARestart arms the key of death in a cluster that has been steady for
// longer than the quarantine window, then restarts its holder gracefully (a deploy): the
// members that take the key over crash. The guard quarantines what the second crashed member
// took from the first, and narrowing takes it down to 1/1024 of the key space.
func TestCrashLoopAfterARestart(t *testing.T) {
	const members = 5
	for _, guard := range []bool{true, false} {
		window := time.Duration(0)
		if !guard {
			window = -1
		}
		l := newCrashLoop(t, members, window)
		l.disarmed = true
		l.run(time.Minute)
		l.disarmed = false
		a, _, _ := l.c.Assignment()
		_, s := a.Lookup(l.poison)
		holder := s.Replicas[0]
		l.members[holder].up = false       // it stops, gracefully,
		l.settle(Deregister{Node: holder}) // and restarts at the next step, before the clean-up
		if !guard {
			l.run(2 * time.Minute)
			t.Logf("guard false: %d crashes, of members %v", len(l.crashes), uniq(l.crashes))
			if len(l.crashes) < 4*members {
				t.Fatalf("without the guard: %d crashes; want the key of death to keep crashing members", len(l.crashes))
			}
			continue
		}
		took := l.checkNarrowed(5 * time.Minute)
		t.Logf("guard true: %d crashes (%v); quarantined %.2f%% of the key space at first, narrowed to %s in %s of virtual time",
			len(l.crashes), l.crashes, 100*float64(l.widest)/math.Exp2(64), describe(l.quarantined()), took)
	}
}

// checkServing checks that the poison key is quarantined and held by no node, and that every
// other slice is held by running members only.
func (l *crashLoop) checkServing() {
	l.t.Helper()
	a, _, _ := l.c.Assignment()
	st := l.c.Status()
	if len(st.Quarantined) == 0 || !slices.ContainsFunc(st.Quarantined, func(q Quarantine) bool { return q.Range.Contains(l.poison) }) {
		l.t.Fatalf("the poison key is not quarantined: %v", st.Quarantined)
	}
	for _, s := range a.All() {
		if s.Range.Contains(l.poison) {
			if !nobodyHolds(s) {
				l.t.Fatalf("the poison key's slice %s is held by %v", s.Range, s.Replicas)
			}
			continue
		}
		for _, id := range s.Replicas {
			if m := l.members[id]; m == nil || !m.up {
				l.t.Fatalf("slice %s is held by %s, which is not running\n%s", s.Range, id, a)
			}
		}
	}
	for id, m := range l.members {
		if !m.up {
			l.t.Fatalf("member %s is not running", id)
		}
	}
}

func uniq(ids []assignment.NodeID) []assignment.NodeID {
	return slices.Compact(slices.Sorted(slices.Values(ids)))
}
