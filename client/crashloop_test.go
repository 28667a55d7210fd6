package client_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// crashLoopTTL is the members' lease in the crash-loop test: short, so that crashes are seen
// quickly, and long enough for heartbeats on a loaded machine.
const crashLoopTTL = 3 * time.Second

// poisonApp is an application that crashes its member whenever it is given the key of
// death: its Acquire of a range holding the key calls crash (the member's process dies
// without leaving the map) and fails.
type poisonApp struct {
	poison uint64
	crash  func()
	mu     sync.Mutex
	held   keyspace.Set
}

func (a *poisonApp) Acquire(_ context.Context, r client.Range, _ client.Grant) error {
	if r.Contains(a.poison) {
		a.crash()
		return errors.New("app: crashed on the key of death")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held = a.held.Union(keyspace.NewSet(keyspaceRange(r)))
	return nil
}

func (a *poisonApp) Release(_ context.Context, r client.Range) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held = a.held.Minus(keyspace.NewSet(keyspaceRange(r)))
	return nil
}

func (a *poisonApp) ChangeRole(context.Context, client.Range, client.Grant) error { return nil }

func (a *poisonApp) holding() keyspace.Set {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

// crashLoop runs members that crash on the key of death and restart, under the same ID,
// once the assigner has dropped them (a restart that outlasts the lease).
type crashLoop struct {
	t      *testing.T
	c      *clustertest.Cluster
	adm    admin
	poison uint64
	stop   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	up      map[string]*poisonApp // the running members' applications
	crashes []string              // the members that crashed, in order
}

// newCrashLoop starts members ids against an assigner whose quarantine guard has window and
// probe (see core.Config).
func newCrashLoop(t *testing.T, window, probe time.Duration, ids ...string) *crashLoop {
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		cfg.Core.NodeTTL, cfg.Core.QuarantineWindow, cfg.Core.QuarantineProbe = crashLoopTTL, window, probe
	}})
	l := &crashLoop{t: t, c: c, adm: newAdmin(c), poison: client.Hash([]byte("key-of-death")), stop: make(chan struct{}),
		up: map[string]*poisonApp{}}
	t.Cleanup(func() { close(l.stop); l.wg.Wait() })
	for _, id := range ids {
		l.wg.Add(1)
		go l.supervise(id)
	}
	return l
}

// supervise runs member id, again and again, until the test ends.
func (l *crashLoop) supervise(id string) {
	defer l.wg.Done()
	for {
		var once sync.Once
		crashed := make(chan struct{})
		app := &poisonApp{poison: l.poison, crash: func() { once.Do(func() { close(crashed) }) }}
		m, err := client.NewMember(client.MemberConfig{ID: id, Address: id + ":1", Assigners: l.c.Assigners(), App: app,
			ReportInterval: 100 * time.Millisecond, Logger: quiet()})
		if err != nil {
			l.t.Errorf("member %s: %v", id, err)
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		l.setUp(id, app)
		select {
		case <-crashed:
			l.crashed(id)
		case <-l.stop:
		}
		cancel() // no Leave: the member is gone as a crashed process is
		<-done
		if !l.waitDropped(id) {
			return
		}
	}
}

func (l *crashLoop) setUp(id string, app *poisonApp) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.up[id] = app
}

func (l *crashLoop) crashed(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.up, id)
	l.crashes = append(l.crashes, id)
}

// waitDropped waits until the assigner no longer lists member id; false if the test ended.
func (l *crashLoop) waitDropped(id string) bool {
	for {
		select {
		case <-l.stop:
			return false
		case <-time.After(50 * time.Millisecond):
		}
		if nodes := l.adm.nodes(context.Background()); nodes != nil && nodes[id] == nil {
			return true
		}
	}
}

func (l *crashLoop) crashList() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.crashes)
}

// quarantined returns the ranges the leader has in quarantine.
func (l *crashLoop) quarantined() []keyspace.Range {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := l.adm.Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return nil
	}
	var out []keyspace.Range
	for _, q := range st.GetQuarantined() {
		if r, err := wire.RangeFromProto(q.GetRange()); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// servesTheRest reports whether every member runs and, between them, their applications
// hold every point outside the quarantine once.
func (l *crashLoop) servesTheRest(members int, quarantined []keyspace.Range) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.up) != members {
		return false
	}
	want := keyspace.NewSet(keyspace.Full()).Minus(keyspace.NewSet(quarantined...))
	var union, overlap keyspace.Set
	for _, a := range l.up {
		h := a.holding()
		overlap, union = overlap.Union(union.Intersect(h)), union.Union(h)
	}
	return union.Equal(want) && overlap.Empty()
}

// spaceShare returns the share of the key space that rs cover.
func spaceShare(rs []keyspace.Range) float64 {
	s := 0.0
	for _, r := range rs {
		s += r.Fraction()
	}
	return s
}

// narrowBound is the share of the key space down to which the assigner narrows a quarantine.
const narrowBound = 1.0 / 1024

// TestAKeyOfDeathCrashesTwoMembers runs four members that crash whenever they acquire one
// key, and restart once the assigner dropped them. With the quarantine guard two crash, and
// what they both acquired is held by no one; narrowing then takes it down to 1/1024 of the
// key space around the key, a crash of a canary per halving at most, and the members serve
// the rest of the key space. Without the guard, the crashes go on from member to member.
// The members crash on acquiring the key, so a canary that has loaded its half has passed:
// the probe is one lease, not the default window, which keeps the test short.
func TestAKeyOfDeathCrashesTwoMembers(t *testing.T) {
	members := []string{"m1", "m2", "m3", "m4"}
	t.Run("guard", func(t *testing.T) {
		t.Parallel() // with the other: each waits on crashes most of its time
		l := newCrashLoop(t, 0, crashLoopTTL, members...)
		var q, first []keyspace.Range
		var found time.Time
		widest := 0.0
		waitFor(t, 180*time.Second, "the key of death's quarantine is narrowed to 1/1024 of the key space", func() bool {
			q = l.quarantined()
			if len(q) > 0 && found.IsZero() {
				found = time.Now()
			}
			if spaceShare(q) > widest {
				widest, first = spaceShare(q), q
			}
			return slices.ContainsFunc(q, func(r keyspace.Range) bool { return r.Contains(l.poison) }) && spaceShare(q) <= narrowBound
		})
		took := time.Since(found)
		waitFor(t, 60*time.Second, "every member runs, and they serve the rest of the key space",
			func() bool { return l.servesTheRest(len(members), q) })
		crashes := l.crashList()
		halvings := int(math.Ceil(math.Log2(widest / narrowBound)))
		t.Logf("with the guard: %d crashes %v; quarantined %.2f%% of the key space at first (%d ranges), narrowed to %v (%.4f%%) in %s",
			len(crashes), crashes, 100*widest, len(first), q, 100*spaceShare(q), took.Round(100*time.Millisecond))
		require.Equal(t, q, l.quarantined(), "the quarantine is narrowed no further")
		require.LessOrEqual(t, len(crashes), 2+halvings, "crashes: %v; want two to find the key, one per halving at most", crashes)
	})
	t.Run("no-guard", func(t *testing.T) {
		t.Parallel()
		l := newCrashLoop(t, -1, 0, members...)
		start := time.Now()
		waitFor(t, 120*time.Second, "the key of death crashes 6 times", func() bool { return len(l.crashList()) >= 6 })
		crashes := l.crashList()
		t.Logf("without the guard: %d crashes in %s %v, and counting", len(crashes), time.Since(start).Round(time.Second), crashes)
		require.Empty(t, l.quarantined())
	})
}
