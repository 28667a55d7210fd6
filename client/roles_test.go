package client_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// primaries checks the roles' safety rule as the applications live it: at no time do two
// members' applications hold the same point as primary. A member's application takes the
// role when Acquire or ChangeRole to RolePrimary is called, and has given it up when
// ChangeRole to RoleSecondary or Release returns.
type primaries struct {
	mu         sync.Mutex
	by         map[string]keyspace.Set // member -> the points its application holds as primary
	violations []string
	taken      map[string]time.Time // "member start" -> when it last became primary of a range starting there
	// exclusive: a member believes itself primary only within its lease (leased, by member:
	// its Member.Leased).
	exclusive bool
	leased    map[string]func() bool
	given     map[uint64]time.Time // start -> when some member last gave up the primary role of a range starting there
	// ordered checks that every release comes after the range's new primary took the role.
	ordered bool
}

func (p *primaries) take(id string, r keyspace.Range) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for other, held := range p.by {
		if other != id && !held.Intersect(keyspace.NewSet(r)).Empty() && (!p.exclusive || p.leased[other] == nil || p.leased[other]()) {
			p.violations = append(p.violations, fmt.Sprintf("%s became primary of %s while %s was primary of %s", id, r, other, held.Intersect(keyspace.NewSet(r))))
		}
	}
	p.by[id] = p.by[id].Union(keyspace.NewSet(r))
	p.taken[fmt.Sprint(id, " ", r.Start)] = time.Now()
}

// takenAt returns when member id last became primary of a range starting at start.
func (p *primaries) takenAt(id string, start uint64) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.taken[fmt.Sprint(id, " ", start)]
}

func (p *primaries) give(id string, r keyspace.Range) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.given != nil && !p.by[id].Intersect(keyspace.NewSet(r)).Empty() {
		p.given[r.Start] = time.Now() // a demotion, or the release of a primary
	}
	p.by[id] = p.by[id].Minus(keyspace.NewSet(r))
}

// release records that member id released r: it must have handed its primary role over
// first, and r's new primary must have taken it, if releases are checked (ordered), so that
// a new primary can still catch up from the old one.
func (p *primaries) release(id string, r keyspace.Range) {
	p.mu.Lock()
	if p.ordered {
		var others keyspace.Set
		for other, held := range p.by {
			if other != id {
				others = others.Union(held)
			}
		}
		if missing := keyspace.NewSet(r).Minus(others); !missing.Empty() {
			p.violations = append(p.violations, fmt.Sprintf("%s released %s before a new primary took %s", id, r, missing))
		}
	}
	p.mu.Unlock()
	p.give(id, r)
}

// givenAt returns when a member last gave up the primary role of a range starting at start.
func (p *primaries) givenAt(start uint64) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.given[start]
}

// covered reports whether every point has a primary.
func (p *primaries) covered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var all keyspace.Set
	for _, s := range p.by {
		all = all.Union(s)
	}
	return all.Equal(keyspace.NewSet(keyspace.Full()))
}

// lease records member id's Member.Leased.
func (p *primaries) lease(id string, leased func() bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.leased == nil {
		p.leased = map[string]func() bool{}
	}
	p.leased[id] = leased
}

// holdsAll reports whether member id's application holds every point as primary.
func (p *primaries) holdsAll(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.by[id].Equal(keyspace.NewSet(keyspace.Full()))
}

// holds reports whether member id's application holds any point as primary.
func (p *primaries) holds(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.by[id].Empty()
}

func (p *primaries) failures() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.violations...)
}

// roleApp is an Application that reports its primaries to a shared checker and takes a while
// to demote itself (it finishes the writes in flight).
type roleApp struct {
	id     string
	check  *primaries
	demote time.Duration
}

func (a *roleApp) Acquire(_ context.Context, r client.Range, g client.Grant) error {
	if g.Role == client.RolePrimary {
		a.check.take(a.id, keyspaceRange(r))
	}
	return nil
}

func (a *roleApp) Release(_ context.Context, r client.Range) error {
	a.check.release(a.id, keyspaceRange(r))
	return nil
}

func (a *roleApp) ChangeRole(ctx context.Context, r client.Range, g client.Grant) error {
	if g.Role == client.RolePrimary {
		a.check.take(a.id, keyspaceRange(r))
		return nil
	}
	select { // the writes in flight finish
	case <-time.After(a.demote):
	case <-ctx.Done():
	}
	a.check.give(a.id, keyspaceRange(r))
	return nil
}

// TestPrimariesMoveGracefully runs three members in a cluster with primary and secondary
// roles, moves the primaries of one of them by operator moves and a drain, and checks that
// no two applications ever held a point as primary at once, that no member released a range
// before its new primary had taken the role, and that every point has a primary once the
// moves are done.
func TestPrimariesMoveGracefully(t *testing.T) {
	t.Run("default", func(t *testing.T) { primariesMoveGracefully(t, false) })
	t.Run("exclusive", func(t *testing.T) { primariesMoveGracefully(t, true) })
}

// primariesMoveGracefully is TestPrimariesMoveGracefully in a cluster exclusive or not: a
// planned move waits for no lease.
func primariesMoveGracefully(t *testing.T, exclusive bool) {
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		cfg.Core.Roles, cfg.Core.Exclusive = core.RolesPrimarySecondary, exclusive
		// A linger this short ends a handoff as soon as the new primary is promoted: the old
		// primary's release then waits only for the new one's claim of the role.
		cfg.Core.HandoffTimeout, cfg.Core.HandoffLinger = 20*time.Second, time.Millisecond
		// The first map waits for the three members: made before m1 registered, it gave m1
		// nothing to move (a failure of this test on a busy machine).
		cfg.Core.FirstMapNodes = 3
	}})
	check := &primaries{by: map[string]keyspace.Set{}, taken: map[string]time.Time{}, given: map[uint64]time.Time{}, ordered: true}
	members := startRoleMembers(t, check, map[string][]string{"m1": c.Assigners(), "m2": c.Assigners(), "m3": c.Assigners()})
	waitFor(t, 30*time.Second, "every point has a primary", check.covered)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	adm := newAdmin(c)
	_, err := adm.Freeze(ctx, &pb.FreezeRequest{Reason: "roles test"}, grpc.WaitForReady(true))
	require.NoError(t, err)

	// Move three slices m1 holds to m2 and back, then to m3.
	list, err := adm.ListSlices(ctx, &pb.ListSlicesRequest{Node: "m1"})
	require.NoError(t, err)
	require.NotEmpty(t, list.GetSlices())
	moved := list.GetSlices()[:min(3, len(list.GetSlices()))]
	var took, gaps []time.Duration // from the move's decision, and from the old primary's demotion, to the new primary taking the role
	for _, to := range []string{"m2", "m1", "m3"} {
		for _, sl := range moved {
			start := sl.GetRange().GetStart()
			decided := time.Now()
			_, err := adm.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Hash{Hash: start}}, To: []string{to}})
			require.NoError(t, err, "move to %s", to)
			waitFor(t, 30*time.Second, to+" is the primary", func() bool {
				l, err := adm.assignments.Lookup(ctx, &pb.LookupRequest{Target: &pb.LookupRequest_Hash{Hash: start}})
				return err == nil && l.GetPrimary() == to && len(l.GetReplicas()) == 1
			})
			took = append(took, check.takenAt(to, start).Sub(decided))
			gaps = append(gaps, check.takenAt(to, start).Sub(check.givenAt(start)))
		}
	}
	require.Empty(t, check.failures())
	slices.Sort(took)
	slices.Sort(gaps)
	t.Logf("primary handovers: %d, decision to new primary: p50 %s, max %s (a demotion takes 50ms); without a primary: p50 %s, max %s",
		len(took), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond),
		gaps[len(gaps)/2].Round(time.Millisecond), gaps[len(gaps)-1].Round(time.Millisecond))

	// m2 drains: its primaries go to the others, each handed over.
	_, err = adm.Unfreeze(ctx, &pb.UnfreezeRequest{})
	require.NoError(t, err)
	require.NoError(t, members["m2"].Drain(ctx))
	waitFor(t, 30*time.Second, "every point has a primary", check.covered)
	require.Empty(t, check.failures())
}

// startRoleMembers starts a member for each ID of assigners, with the assigners' addresses
// it is given and a roleApp reporting to check that takes 50 ms to demote itself; each runs
// until the test ends.
func startRoleMembers(t *testing.T, check *primaries, assigners map[string][]string) map[string]*client.Member {
	t.Helper()
	members := map[string]*client.Member{}
	for id, addrs := range assigners {
		m, err := client.NewMember(client.MemberConfig{ID: id, Address: id + ":1", Assigners: addrs,
			App: &roleApp{id: id, check: check, demote: 50 * time.Millisecond}, Roles: client.RolesPrimarySecondary,
			ReportInterval: 100 * time.Millisecond, Logger: quiet()})
		require.NoError(t, err)
		members[id] = m
		check.lease(id, m.Leased)
		runMember(t, m)
	}
	return members
}

// runMember runs m until the test ends.
func runMember(t *testing.T, m *client.Member) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "Member.Run")
		case <-time.After(10 * time.Second):
			t.Error("Member.Run did not return after its context ended")
		}
	})
}

// roleCluster runs a cluster with primary and secondary roles and a member of it for each
// of addrs (ID -> the address it serves at), with balancing frozen once every point has a
// primary, and a router of it; each ends with the test.
func roleCluster(t *testing.T, addrs map[string]string, policy client.Policy) (*clustertest.Cluster, *client.Router) {
	t.Helper()
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		cfg.Core.Roles = core.RolesPrimarySecondary
	}})
	check := &primaries{by: map[string]keyspace.Set{}, taken: map[string]time.Time{}}
	for id, addr := range addrs {
		m, err := client.NewMember(client.MemberConfig{ID: id, Address: addr, Assigners: c.Assigners(),
			App: &roleApp{id: id, check: check}, Roles: client.RolesPrimarySecondary, ReportInterval: 100 * time.Millisecond, Logger: quiet()})
		require.NoError(t, err)
		runMember(t, m)
	}
	waitFor(t, 30*time.Second, "every point has a primary", check.covered)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := newAdmin(c).Freeze(ctx, &pb.FreezeRequest{Reason: "routing test"}, grpc.WaitForReady(true))
	require.NoError(t, err, "no pass moves a primary while the test compares")
	r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), Policy: policy, Logger: quiet()})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(rctx) }() //nolint:errcheck // nil when rctx ends
	t.Cleanup(func() { stop(); <-done })
	require.NoError(t, r.WaitReady(ctx))
	return c, r
}
