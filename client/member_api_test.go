package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

// eventApp is an Application that logs its calls, as "ID CALL", in one list shared by the
// members of a test.
type eventApp struct {
	id  string
	log *events
}

type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, s)
}

// tail returns the last n events, for a failure's message.
func (e *events) tail(n int) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.list[max(len(e.list)-n, 0):]...)
}

// index returns the position of the first event that starts with prefix, -1 for none.
func (e *events) index(prefix string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, s := range e.list {
		if strings.HasPrefix(s, prefix) {
			return i
		}
	}
	return -1
}

func (a *eventApp) Acquire(_ context.Context, r client.Range, g client.Grant) error {
	a.log.add(a.id + " acquire " + g.Role.String() + " " + r.String())
	return nil
}

func (a *eventApp) Release(_ context.Context, r client.Range) error {
	a.log.add(a.id + " release " + r.String())
	return nil
}

func (a *eventApp) ChangeRole(_ context.Context, r client.Range, g client.Grant) error {
	a.log.add(a.id + " change " + g.Role.String() + " " + r.String())
	return nil
}

// TestAWriteHoldsOffItsKeysDemotion moves a primary while a write of one of its keys runs
// under Member.Write: from the start of the demotion the key is not the member's to write
// (a new write is refused with ErrNotOwner, and Grant says secondary), but the application
// is told to demote only once the write in flight has returned, and the new primary takes
// the role after that.
func TestAWriteHoldsOffItsKeysDemotion(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		cfg.Core.Roles, cfg.Core.FirstMapNodes = core.RolesPrimarySecondary, 2
		cfg.Core.HandoffLinger = 200 * time.Millisecond
	}})
	log := &events{}
	members := map[string]*client.Member{}
	for _, id := range []string{"m1", "m2"} {
		m, err := client.NewMember(client.MemberConfig{ID: id, Address: id + ":1", Assigners: c.Assigners(),
			App: &eventApp{id: id, log: log}, Roles: client.RolesPrimarySecondary, ReportInterval: 100 * time.Millisecond, Logger: quiet()})
		require.NoError(t, err)
		members[id] = m
		runMember(t, m)
	}
	m1 := members["m1"]
	var key []byte
	waitFor(t, 30*time.Second, "m1 is the primary of a key", func() bool {
		key = nil
		for _, r := range m1.Slices() {
			if k := keyIn(keyspaceRange(r)); m1.Write(t.Context(), k, func(client.Grant) error { return nil }) == nil {
				key = k
				return true
			}
		}
		return false
	})
	g, ok := m1.Grant(key)
	require.True(t, ok)
	require.Equal(t, client.RolePrimary, g.Role)
	interceptorAnswers(t, m1, key)

	writing, finish := make(chan struct{}), make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		wrote <- m1.Write(context.Background(), key, func(client.Grant) error {
			close(writing)
			<-finish
			log.add("m1 write returned")
			return nil
		})
	}()
	<-writing
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	adm := newAdmin(c)
	_, err := adm.Freeze(ctx, &pb.FreezeRequest{Reason: "member api test"}, grpc.WaitForReady(true))
	require.NoError(t, err)
	_, err = adm.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}, To: []string{"m2"}})
	require.NoError(t, err)

	waitFor(t, 20*time.Second, "m1 no longer takes writes of the key", func() bool {
		return errors.Is(m1.Write(t.Context(), key, func(client.Grant) error { return nil }), client.ErrNotOwner)
	})
	g, ok = m1.Grant(key)
	require.True(t, ok && g.Role == client.RoleSecondary, "m1's grant while it demotes: %v %v", g, ok)
	close(finish)
	require.NoError(t, <-wrote)
	m2 := members["m2"]
	waitFor(t, 20*time.Second, "m2 takes writes of the key", func() bool {
		return m2.Write(t.Context(), key, func(client.Grant) error { return nil }) == nil
	})
	returned, demoted, promoted := log.index("m1 write returned"), log.index("m1 change secondary"), log.index("m2 change primary")
	require.True(t, returned < demoted && demoted < promoted, "the write, m1's demotion and m2's promotion out of order: %v", log.tail(6))

	err = m1.Write(t.Context(), key, func(client.Grant) error { return nil })
	var notOwner *client.NotOwnerError
	require.ErrorAs(t, err, &notOwner)
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "a gRPC handler returning it answers NotOwner")
}

// TestAMemberOfAnotherRoleModelStops runs a member that acts on primaries in a cluster
// without roles: the assigner refuses it, and Run returns that error instead of going on.
func TestAMemberOfAnotherRoleModelStops(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{})
	m, err := client.NewMember(client.MemberConfig{ID: "m1", Address: "m1:1", Assigners: c.Assigners(),
		App: &eventApp{id: "m1", log: &events{}}, Roles: client.RolesPrimarySecondary, Logger: quiet()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = m.Run(ctx)
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "Run returned only when its context ended")
	require.Contains(t, err.Error(), "roles")
	require.Equal(t, 1, strings.Count(err.Error(), "client:"), "a doubled prefix: %v", err)
}

// TestAGivenUpDrainEnds drains a member whose ranges cannot move (the other member's
// acquires wait): once Drain's context ends, the member is not left draining.
func TestAGivenUpDrainEnds(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) { cfg.Core.FirstMapNodes = 2 }})
	a1, a2 := &app{}, &app{}
	m1 := startMember(t, c, "m1", a1, 10*time.Second)
	startMember(t, c, "m2", a2, 10*time.Second)
	waitFor(t, 30*time.Second, "both members hold ranges", func() bool { return !a1.holding().Empty() && !a2.holding().Empty() })
	gate := make(chan struct{})
	defer close(gate)
	a2.set(gate, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	require.ErrorIs(t, m1.Drain(ctx), context.DeadlineExceeded)
	adm := newAdmin(c)
	nodes := adm.nodes(t.Context())
	require.NotNil(t, nodes["m1"])
	require.False(t, nodes["m1"].GetDraining(), "m1 is left draining")
}

// TestCallsRunInParallel takes one of two members away: the other is given its ranges, apart
// from one another, and acquires them at once rather than one after the other.
func TestCallsRunInParallel(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) { cfg.Core.FirstMapNodes = 2 }})
	var running, most atomic.Int64
	gate := make(chan struct{})
	a2 := &parallelApp{running: &running, most: &most}
	m1, err := client.NewMember(client.MemberConfig{ID: "m1", Address: "m1:1", Assigners: c.Assigners(), App: &app{},
		ReportInterval: 100 * time.Millisecond, Logger: quiet()})
	require.NoError(t, err)
	ctx1, stop1 := context.WithCancel(t.Context())
	done1 := make(chan error, 1)
	go func() { done1 <- m1.Run(ctx1) }()
	m2 := startMemberApp(t, c, "m2", a2)
	waitFor(t, 30*time.Second, "both members hold ranges", func() bool { return len(m1.Slices()) > 0 && len(m2.Slices()) > 0 })
	require.Greater(t, len(m1.Slices()), 1)
	a2.gate.Store(&gate)
	most.Store(0)
	stop1()
	require.NoError(t, <-done1)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, m1.Leave(ctx))
	waitFor(t, 30*time.Second, "m2 acquires m1's ranges at once", func() bool { return most.Load() >= 2 })
	close(gate)
	t.Logf("calls at once: %d", most.Load())
}

// parallelApp counts its acquires running at once; while gate is set, each waits for it.
type parallelApp struct {
	running, most *atomic.Int64
	gate          atomic.Pointer[chan struct{}]
}

func (a *parallelApp) Acquire(ctx context.Context, _ client.Range, _ client.Grant) error {
	n := a.running.Add(1)
	defer a.running.Add(-1)
	for m := a.most.Load(); n > m && !a.most.CompareAndSwap(m, n); m = a.most.Load() {
	}
	if g := a.gate.Load(); g != nil {
		select {
		case <-*g:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (a *parallelApp) Release(context.Context, client.Range) error { return nil }

func (a *parallelApp) ChangeRole(context.Context, client.Range, client.Grant) error { return nil }

// startMemberApp runs a member of c with application a until the test ends.
func startMemberApp(t *testing.T, c *clustertest.Cluster, id string, a client.Application) *client.Member {
	t.Helper()
	m, err := client.NewMember(client.MemberConfig{ID: id, Address: id + ":1", Assigners: c.Assigners(), App: a,
		ReportInterval: 100 * time.Millisecond, Logger: quiet()})
	require.NoError(t, err)
	runMember(t, m)
	return m
}

// interceptorAnswers checks Member.UnaryServerInterceptor on m: a write of key, which m is the
// primary of, runs with the grant in its context; a write of a key m does not serve is
// answered NotOwner without running.
func interceptorAnswers(t *testing.T, m *client.Member, key []byte) {
	t.Helper()
	keyOf := func(method string, req any) ([]byte, bool, bool) {
		return req.([]byte), method == "/test.Service/Write", true
	}
	ic := m.UnaryServerInterceptor(keyOf)
	var seen client.Grant
	handler := func(ctx context.Context, _ any) (any, error) {
		seen, _ = client.GrantFrom(ctx)
		return "done", nil
	}
	resp, err := ic(t.Context(), key, &grpc.UnaryServerInfo{FullMethod: "/test.Service/Write"}, handler)
	require.NoError(t, err)
	require.Equal(t, "done", resp)
	require.Equal(t, client.RolePrimary, seen.Role)
	var other []byte
	for i := 0; other == nil; i++ {
		if k := []byte(fmt.Sprintf("other-%d", i)); !m.Serving(k) {
			other = k
		}
	}
	seen = client.Grant{}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err = ic(ctx, other, &grpc.UnaryServerInfo{FullMethod: "/test.Service/Write"}, handler)
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	require.Zero(t, seen, "the handler ran for a key the member does not own")
}

// TestARouterSaysWhyItHasNoMap starts a router whose certificate the assigners' CA did not
// issue: WaitReady ends with the context's error and says what the watch met.
func TestARouterSaysWhyItHasNoMap(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{TLS: true})
	f := mtlstest.New(t).Config("router", "stranger") // of another CA
	r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), TLS: client.TLS{Cert: f.Cert, Key: f.Key, CA: f.CA}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer wcancel()
	err = r.WaitReady(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "the last watch:")
}

// TestAMemberIsReadyOnAFreshCluster starts one member in a new cluster, with no load: it is
// Ready once registered and given the first map, whose generation is 0.
func TestAMemberIsReadyOnAFreshCluster(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{})
	m := startMember(t, c, "m1", &app{}, 10*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, m.WaitReady(ctx))
	require.True(t, m.Ready())
}
