package client

// Tests of how the Transport and the gRPC interceptor try a call again: against fake
// members in the test process, with a router fed maps by the test (no assigner), so that the
// test decides when the key's route changes and when only other slices' do.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// fakeMember is a member's server, gRPC or HTTP, that counts the calls it gets and answers
// NotOwner (421) while refuse is set; gen is the map generation the last call said (0: none).
type fakeMember struct {
	addr   string
	calls  atomic.Int64
	refuse atomic.Bool
	gen    atomic.Uint64
}

// grpcMember starts a fake member serving the gRPC health service.
func grpcMember(t *testing.T) *fakeMember {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m := &fakeMember{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		m.calls.Add(1)
		m.gen.Store(callerGenerationOf(ctx))
		if m.refuse.Load() {
			return nil, NotOwner([]byte("k"))
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis) //nolint:errcheck // it returns when stopped
	t.Cleanup(srv.Stop)
	return m
}

// httpMember starts a fake member serving HTTP.
func httpMember(t *testing.T) *fakeMember {
	t.Helper()
	m := &fakeMember{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.calls.Add(1)
		m.gen.Store(callerGenerationOf(HTTPContext(r)))
		if m.refuse.Load() {
			http.Error(w, "not mine", http.StatusMisdirectedRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	m.addr = strings.TrimPrefix(srv.URL, "http://")
	return m
}

// caller sends a call for a key through a router, as one of the two paths does: a read, or
// a write.
type caller func(ctx context.Context, key []byte, write bool) error

// grpcCaller returns a caller through a ClientConn made with GRPCDialOptions(r).
func grpcCaller(t *testing.T, r *Router) caller {
	t.Helper()
	conn, err := grpc.NewClient("sliceplane:///retry", append(GRPCDialOptions(r), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	return func(ctx context.Context, key []byte, write bool) error {
		keyed := WithKey
		if write {
			keyed = WithWriteKey
		}
		_, err := hc.Check(keyed(ctx, key), &healthpb.HealthCheckRequest{})
		return err
	}
}

// httpCaller returns a caller through a Transport of r: the key is the request's path, a
// write a POST.
func httpCaller(t *testing.T, r *Router) caller {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	hc := &http.Client{Transport: &Transport{Router: r, Base: base, Key: pathKey}}
	return func(ctx context.Context, key []byte, write bool) error {
		method := http.MethodGet
		if write {
			method = http.MethodPost
		}
		return send(ctx, hc, method, key, nil)
	}
}

// pathKey is a Transport's Key: the path, a write unless the method is GET.
func pathKey(req *http.Request) ([]byte, bool, error) {
	return []byte(strings.TrimPrefix(req.URL.Path, "/")), req.Method != http.MethodGet, nil
}

// send sends a request for key with hc, and wants 204 No Content.
func send(ctx context.Context, hc *http.Client, method string, key []byte, header http.Header) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://member/"+string(key), nil)
	if err != nil {
		return err
	}
	maps.Copy(req.Header, header)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

// paths are the two ways of sending calls through a router, and the fake members of each.
var paths = []struct {
	name   string
	member func(*testing.T) *fakeMember
	caller func(*testing.T, *Router) caller
}{
	{"grpc", grpcMember, grpcCaller},
	{"http", httpMember, httpCaller},
}

// mapFeed feeds a router the maps a test makes: two slices, [0, 2^63) held by left (the
// test key's) and [2^63, end) by right, each map a new generation.
type mapFeed struct {
	r   *Router
	mu  sync.Mutex
	gen uint64
}

// set applies a map in which the halves are held by left and right.
func (f *mapFeed) set(left, right assignment.Slice) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	left.Range = keyspace.Range{Start: 0, End: keyspace.At(1 << 63)}
	right.Range = keyspace.Range{Start: 1 << 63, End: keyspace.End}
	a, err := assignment.New(f.gen, []assignment.Slice{left, right})
	if err != nil {
		return err
	}
	return f.r.apply(reinit(a, 1, f.gen, f.gen))
}

// churn changes the right half's replicas every 2 ms, between a and b, until the test ends,
// while the left half stays held by left: the map changes, the test key's route does not.
func (f *mapFeed) churn(t *testing.T, left assignment.Slice, a, b assignment.NodeID) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			right := assignment.Slice{Replicas: ids(string(a))}
			if i%2 == 1 {
				right.Replicas = ids(string(b))
			}
			if err := f.set(left, right); err != nil {
				t.Error(err)
				return
			}
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// leftKey returns a key of the left half.
func leftKey(t *testing.T) []byte { return keyOfHalf(t, false) }

// rightKey returns a key of the right half.
func rightKey(t *testing.T) []byte { return keyOfHalf(t, true) }

func keyOfHalf(t *testing.T, right bool) []byte {
	t.Helper()
	for i := range 1000 {
		if k := fmt.Appendf(nil, "key-%d", i); Hash(k) >= 1<<63 == right {
			return k
		}
	}
	t.Fatal("no key in the half")
	return nil
}

// retryRig is a router whose map the test feeds, and fake members x, y and z: the test key's
// slice on x, the other on y.
type retryRig struct {
	r       *Router
	feed    *mapFeed
	x, y, z *fakeMember
	key     []byte
	call    caller
}

func newRetryRig(t *testing.T, member func(*testing.T) *fakeMember, call func(*testing.T, *Router) caller) *retryRig {
	t.Helper()
	x, y, z := member(t), member(t), member(t)
	a, err := assignment.New(1, []assignment.Slice{
		{Range: keyspace.Range{Start: 0, End: keyspace.At(1 << 63)}, Replicas: ids("x")},
		{Range: keyspace.Range{Start: 1 << 63, End: keyspace.End}, Replicas: ids("y")},
	})
	require.NoError(t, err)
	r := newTestRouter(t, RoundRobin, a, map[assignment.NodeID]nodeInfo{
		"x": {address: x.addr, capacity: 1}, "y": {address: y.addr, capacity: 1}, "z": {address: z.addr, capacity: 1},
	})
	rig := &retryRig{r: r, feed: &mapFeed{r: r, gen: 1}, x: x, y: y, z: z, key: leftKey(t), call: call(t, r)}
	rig.warmUp(t)
	return rig
}

// warmUp sends a call to x and one to y, so that a test's calls find their connections made,
// and then forgets them: the members' counts and the router's stats start from zero.
func (rig *retryRig) warmUp(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, rig.call(ctx, rig.key, false))
	require.NoError(t, rig.call(ctx, rightKey(t), false))
	rig.x.calls.Store(0)
	rig.y.calls.Store(0)
	rig.r.stats = retryStats{}
}

// TestRetryWaitsForTheKeysRoute has x answer NotOwner (421) while the map changes every 2 ms,
// but not for the key: the call is tried again after a backoff, not at every map, and ends at
// its deadline with DeadlineExceeded, the answer in its message.
func TestRetryWaitsForTheKeysRoute(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			rig := newRetryRig(t, p.member, p.caller)
			rig.x.refuse.Store(true)
			rig.feed.churn(t, assignment.Slice{Replicas: ids("x")}, "y", "z")
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			start := time.Now()
			err := rig.call(ctx, rig.key, false)
			require.Error(t, err)
			gens := rig.r.Generation()
			t.Logf("%d tries to x in %s, over %d maps: %v", rig.x.calls.Load(), time.Since(start).Round(time.Millisecond), gens, err)
			assert.Greater(t, gens, uint64(100), "the map changed all along")
			// A backoff of 5 ms doubling to 1 s, less a fifth of jitter, leaves room for 10
			// tries in 2 s; tried at every map, x would get hundreds.
			assert.LessOrEqual(t, rig.x.calls.Load(), int64(12), "x is not asked again at every map")
			assert.GreaterOrEqual(t, rig.x.calls.Load(), int64(4), "x is asked again after the backoff")
			assertExpired(t, err, codes.DeadlineExceeded, "client: the key's replicas answered NotOwner until the deadline: ")
			assert.Zero(t, rig.y.calls.Load()+rig.z.calls.Load(), "nothing else holds the key")
			// A try sent as the deadline came may not have reached x.
			st, tries := rig.r.Stats(), uint64(rig.x.calls.Load())
			assert.Contains(t, []uint64{tries - 1, tries}, st.NotOwner, "every try again counted: %+v", st)
			st.NotOwner = 0
			assert.Equal(t, RouterStats{Retried: 1, Expired: 1}, st)
		})
	}
}

// TestCallsSayTheMapGenerationWhileTheMapIsFresh sends a call under a map just taken, and
// one under the same map aged past freshMapFor: the first says the map's generation to the
// member, which may not have the map yet; the second, sent when every member has had the
// time to take it, leaves it out.
func TestCallsSayTheMapGenerationWhileTheMapIsFresh(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			rig := newRetryRig(t, p.member, p.caller)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			require.NoError(t, rig.feed.set(assignment.Slice{Replicas: ids("x")}, assignment.Slice{Replicas: ids("y")}))
			require.NoError(t, rig.call(ctx, rig.key, true))
			assert.Equal(t, uint64(2), rig.x.gen.Load(), "a call under a fresh map says its generation")
			aged := *rig.r.view.Load()
			aged.since = time.Now().Add(-freshMapFor)
			rig.r.view.Store(&aged)
			require.NoError(t, rig.call(ctx, rig.key, true))
			assert.Zero(t, rig.x.gen.Load(), "a call under a map older than %s says nothing of it", freshMapFor)
		})
	}
}

// TestRetryFollowsTheKeysRoute has x answer NotOwner (421) until the call's backoff has
// grown past half a second, then moves the key's slice to y: the call goes to y at once,
// not after the backoff, and x is not asked again.
func TestRetryFollowsTheKeysRoute(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			rig := newRetryRig(t, p.member, p.caller)
			rig.x.refuse.Store(true)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- rig.call(ctx, rig.key, false) }()
			// After its 8th try the call waits at least 5 ms × 2^7 × 0.8 = 512 ms.
			waitUntil(t, 20*time.Second, "x is asked 8 times", func() bool { return rig.x.calls.Load() >= 8 })
			tries := rig.x.calls.Load()
			moved := time.Now()
			require.NoError(t, rig.feed.set(assignment.Slice{Replicas: ids("y")}, assignment.Slice{Replicas: ids("z")}))
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-ctx.Done():
				t.Fatal("the call did not end")
			}
			took := time.Since(moved)
			t.Logf("the call reached y %s after the move", took.Round(time.Millisecond))
			assert.Less(t, took, 150*time.Millisecond, "the call follows the key's route, not its backoff")
			assert.Equal(t, int64(1), rig.y.calls.Load())
			assert.Equal(t, tries, rig.x.calls.Load(), "x is not asked again")
			assert.Equal(t, RouterStats{Retried: 1, NotOwner: uint64(tries)}, rig.r.Stats())
		})
	}
}

// waitUntil polls cond every millisecond until it holds, and fails the test if it does not
// within the deadline.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// assertExpired checks the error of a call that ended while it was tried again: its code
// (gRPC) or its context's error (errors.Is), and its message, which begins with prefix and
// carries the package's prefix once.
func assertExpired(t *testing.T, err error, code codes.Code, prefix string) {
	t.Helper()
	require.Error(t, err)
	assert.Equal(t, code, status.Code(err), "%v", err)
	if code == codes.DeadlineExceeded {
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	} else {
		assert.ErrorIs(t, err, context.Canceled)
	}
	msg := status.Convert(err).Message()
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = ue.Err.Error()
	}
	assert.True(t, strings.HasPrefix(msg, prefix), "%q begins with %q", msg, prefix)
	assert.Equal(t, 1, strings.Count(msg, "client:"), "one prefix: %q", msg)
}

// TestMovedFollowsTheKeysRouteOnly checks the rule that ends a wait before its backoff: the
// key's route changed so that the call would not go where its try went.
func TestMovedFollowsTheKeysRouteOnly(t *testing.T) {
	x := Replica{ID: "x", Address: "x:1", Role: RoleReplica}
	w := Replica{ID: "w", Address: "w:1", Role: RoleReplica}
	set := func(primary int, reps ...Replica) *replicaSet { return &replicaSet{replicas: reps, primary: primary} }
	as := func(r Replica, role Role, token uint64) Replica { r.Role, r.Token = role, token; return r }
	xAlone := set(-1, x)
	primaryX := set(0, as(x, RolePrimary, 3), as(w, RoleSecondary, 0))
	stale := set(-1, x, w)
	stale.fresh = set(-1, w)
	cases := []struct {
		name  string
		t     try
		write bool
		now   *replicaSet
		want  bool
	}{
		{"the first map", try{}, false, xAlone, true},
		{"the same route", try{route: xAlone, to: &x}, false, xAlone, false},
		{"the route rebuilt alike", try{route: xAlone, to: &x}, false, set(-1, x), false},
		{"no replica was chosen: any change", try{route: set(-1, w)}, false, xAlone, true},
		{"another replica joins x", try{route: xAlone, to: &x}, false, set(-1, w, x), false},
		{"x leaves", try{route: set(-1, w, x), to: &x}, false, set(-1, w), true},
		{"x moves to another address", try{route: xAlone, to: &x}, false, set(-1, Replica{ID: "x", Address: "x:2", Role: RoleReplica}), true},
		{"x turns stale", try{route: set(-1, x, w), to: &x}, false, stale, true},
		{"a secondary joins primary x", try{route: set(0, as(x, RolePrimary, 3)), to: &primaryX.replicas[0]}, true, primaryX, false},
		{"x is primary under a new grant", try{route: primaryX, to: &primaryX.replicas[0]}, true, set(0, as(x, RolePrimary, 4), as(w, RoleSecondary, 0)), true},
		{"w is primary", try{route: primaryX, to: &primaryX.replicas[0]}, true, set(1, as(x, RoleSecondary, 0), as(w, RolePrimary, 5)), true},
		{"x hands its role over", try{route: primaryX, to: &primaryX.replicas[0]}, true, set(-1, as(x, RoleSecondary, 0), as(w, RoleSecondary, 0)), true},
		{"a read of secondary x, w now primary", try{route: primaryX, to: &primaryX.replicas[1]}, false, set(1, as(x, RoleSecondary, 0), as(w, RolePrimary, 5)), true},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, moved(tc.t, tc.now, tc.write), tc.name)
	}
}

// TestRetryEndsAtTheDeadlineSayingWhy: a call that could not be sent (a write while its
// slice's primary hands the role over; a member that refuses connections) ends at its
// deadline with DeadlineExceeded, what it met in the message; a call canceled while it waits
// ends Canceled.
func TestRetryEndsAtTheDeadlineSayingWhy(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			rig := newRetryRig(t, p.member, p.caller)
			require.NoError(t, rig.feed.set(assignment.Slice{Replicas: ids("x", "y"), Primary: "x", Next: "y", Token: 2}, assignment.Slice{Replicas: ids("z")}))
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			err := rig.call(ctx, rig.key, true)
			assertExpired(t, err, codes.DeadlineExceeded, "client: the call could not be sent until the deadline: ")
			assert.Contains(t, err.Error(), "no primary")
			assert.Zero(t, rig.x.calls.Load()+rig.y.calls.Load(), "nothing was sent")
			st := rig.r.Stats()
			assert.Positive(t, st.NotSent)
			assert.Equal(t, uint64(1), st.Expired)

			ctx, cancel = context.WithCancel(t.Context())
			time.AfterFunc(100*time.Millisecond, cancel)
			assertExpired(t, rig.call(ctx, rig.key, true), codes.Canceled, "client: the call could not be sent until the call was canceled: ")
		})
	}
	t.Run("refused", func(t *testing.T) {
		r := newTestRouter(t, RoundRobin, everywhere(t, "dead"), map[assignment.NodeID]nodeInfo{"dead": {address: deadAddr(t), capacity: 1}})
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		err := httpCaller(t, r)(ctx, leftKey(t), false)
		assertExpired(t, err, codes.DeadlineExceeded, "client: the call could not be sent until the deadline: ")
		assert.Contains(t, err.Error(), "connection refused")
		assert.Positive(t, r.Stats().NotSent)
	})
}

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestARequestStillDialingAtItsDeadlineWasNotSent: a request whose connection is refused,
// then still dialing (no connection yet) when its deadline comes, ends saying it could not
// be sent, with what the try before met; once it has a connection and no answer comes, it
// names the replica that did not answer.
func TestARequestStillDialingAtItsDeadlineWasNotSent(t *testing.T) {
	for _, connects := range []bool{false, true} {
		t.Run(fmt.Sprintf("connected=%t", connects), func(t *testing.T) {
			r := newTestRouter(t, RoundRobin, everywhere(t, "far"), map[assignment.NodeID]nodeInfo{"far": {address: "127.0.0.1:1", capacity: 1}})
			var tries atomic.Int64
			base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if tries.Add(1) == 1 {
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
				}
				if trace := httptrace.ContextClientTrace(req.Context()); connects && trace != nil && trace.GotConn != nil {
					trace.GotConn(httptrace.GotConnInfo{})
				}
				<-req.Context().Done()
				return nil, req.Context().Err()
			})
			hc := &http.Client{Transport: &Transport{Router: r, Base: base, Key: pathKey}}
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			err := send(ctx, hc, http.MethodGet, leftKey(t), nil)
			require.Equal(t, int64(2), tries.Load(), "tried again after the refusal")
			if connects {
				assertExpired(t, err, codes.DeadlineExceeded, "client: far at 127.0.0.1:1 did not answer before the call ended: ")
				return
			}
			assertExpired(t, err, codes.DeadlineExceeded, "client: the call could not be sent until the deadline: ")
			assert.Contains(t, err.Error(), "connection refused")
		})
	}
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

// TestACallIsSentWhenNoNodeIsConnected: while no connection of the ClientConn is ready (its
// only node refuses them), a call is not sent and tried again, rather than failed at once,
// and goes out once the map names a node that serves.
func TestACallIsSentWhenNoNodeIsConnected(t *testing.T) {
	r := newTestRouter(t, RoundRobin, everywhere(t, "dead"), map[assignment.NodeID]nodeInfo{"dead": {address: deadAddr(t), capacity: 1}})
	call := grpcCaller(t, r)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx, leftKey(t), false) }()
	waitUntil(t, 20*time.Second, "the call is tried again", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the call ended: %v", err)
		default:
		}
		return r.Stats().NotSent >= 3
	})
	x := grpcMember(t)
	r.setNodes(map[assignment.NodeID]nodeInfo{"dead": {address: deadAddr(t), capacity: 1}, "x": {address: x.addr, capacity: 1}})
	feed := &mapFeed{r: r, gen: 1}
	require.NoError(t, feed.set(assignment.Slice{Replicas: ids("x")}, assignment.Slice{Replicas: ids("x")}))
	require.NoError(t, <-done)
	assert.Equal(t, int64(1), x.calls.Load())
}

// TestACallBeforeTheFirstMapWaitsForIt: a call made before the router's first map is not sent
// and tried again: it goes out once the map comes, and ends at its deadline saying why if it
// does not.
func TestACallBeforeTheFirstMapWaitsForIt(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			r, err := NewRouter(RouterConfig{Assigners: []string{"127.0.0.1:1"}})
			require.NoError(t, err)
			close(r.started) // the test feeds it maps as Run would
			call := p.caller(t, r)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second) // room to connect first
			defer cancel()
			err = call(ctx, leftKey(t), false)
			assertExpired(t, err, codes.DeadlineExceeded, "client: the call could not be sent until the deadline: ")
			assert.Regexp(t, "no map yet|no assignment applied yet", err.Error())

			x := p.member(t)
			ctx, cancel = context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			tried := r.Stats().NotSent
			go func() { done <- call(ctx, leftKey(t), false) }()
			waitUntil(t, 20*time.Second, "the call is tried again", func() bool { return r.Stats().NotSent >= tried+2 })
			r.setNodes(map[assignment.NodeID]nodeInfo{"x": {address: x.addr, capacity: 1}})
			feed := &mapFeed{r: r}
			require.NoError(t, feed.set(assignment.Slice{Replicas: ids("x")}, assignment.Slice{Replicas: ids("x")}))
			require.NoError(t, <-done)
			assert.Equal(t, int64(1), x.calls.Load())
		})
	}
}

// TestACallThroughARouterThatDoesNotRunFails: a call through a router whose Run was never
// called fails with ErrRouterNotRunning (FailedPrecondition) after the grace left for a Run
// just started, not at its deadline; one waiting for a first map when Run returns fails so
// then; one made after Run returned fails at once.
func TestACallThroughARouterThatDoesNotRunFails(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			r, err := NewRouter(RouterConfig{Assigners: []string{deadAddr(t)}, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			call := p.caller(t, r)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			start := time.Now()
			assertNotRunning(t, call(ctx, leftKey(t), false))
			assert.Less(t, time.Since(start), 5*time.Second, "not at the deadline")

			rctx, stop := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- r.Run(rctx) }()
			<-r.started // the call is not to wait out the grace for Run to start
			done := make(chan error, 1)
			go func() { done <- call(ctx, leftKey(t), false) }()
			select {
			case err := <-done:
				t.Fatalf("the call ended before the first map: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			stop()
			require.NoError(t, <-ran)
			select {
			case err := <-done:
				assertNotRunning(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the call did not end when Run returned")
			}

			start = time.Now()
			assertNotRunning(t, call(ctx, leftKey(t), false))
			assert.Less(t, time.Since(start), startGrace, "at once")
		})
	}
}

// assertNotRunning checks the error of a call through a router that does not run.
func assertNotRunning(t *testing.T, err error) {
	t.Helper()
	assert.ErrorIs(t, err, ErrRouterNotRunning)
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "client: the router is not running (Router.Run not called, or returned)")
}

// breakingListener is a listener that can close every connection it accepted.
type breakingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *breakingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// breakAll closes the connections accepted so far.
func (l *breakingListener) breakAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// breakingGRPCMember starts a fake member serving the gRPC health service that breaks its
// connections (no answer) on the call that finds breakNext set.
func breakingGRPCMember(t *testing.T, breakNext *atomic.Bool) *fakeMember {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	bl := &breakingListener{Listener: lis}
	m := &fakeMember{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		m.calls.Add(1)
		if breakNext.CompareAndSwap(true, false) {
			bl.breakAll()
			return nil, status.Error(codes.Internal, "the connection is broken: this answer is not sent")
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(bl) //nolint:errcheck // it returns when stopped
	t.Cleanup(srv.Stop)
	return m
}

// TestAnIdempotentReadIsSentAgainAfterItsConnectionBroke: a gRPC call made with
// WithIdempotentKey whose connection breaks once it went out is tried again; one made with
// WithKey or WithWriteKey is not, and fails Unavailable.
func TestAnIdempotentReadIsSentAgainAfterItsConnectionBroke(t *testing.T) {
	cases := []struct {
		name  string
		keyed func(context.Context, []byte) context.Context
		again bool
	}{
		{"idempotent", WithIdempotentKey, true},
		{"read", WithKey, false},
		{"write", WithWriteKey, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var breakNext atomic.Bool
			x := breakingGRPCMember(t, &breakNext)
			r := newTestRouter(t, RoundRobin, everywhere(t, "x"), map[assignment.NodeID]nodeInfo{"x": {address: x.addr, capacity: 1}})
			conn, err := grpc.NewClient("sliceplane:///retry", append(GRPCDialOptions(r), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
			require.NoError(t, err)
			defer conn.Close()
			hc := healthpb.NewHealthClient(conn)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err = hc.Check(tc.keyed(ctx, leftKey(t)), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			require.NoError(t, err, "connected")
			base := r.Stats()

			breakNext.Store(true)
			_, err = hc.Check(tc.keyed(ctx, leftKey(t)), &healthpb.HealthCheckRequest{})
			st := r.Stats()
			if tc.again {
				require.NoError(t, err)
				assert.Equal(t, int64(3), x.calls.Load(), "sent again")
				assert.Equal(t, uint64(1), st.Broken-base.Broken)
				assert.Equal(t, uint64(1), st.Retried-base.Retried)
				return
			}
			assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			assert.Equal(t, int64(2), x.calls.Load(), "not sent again")
			assert.Equal(t, base, st)
		})
	}
}

// TestAnIdempotentRequestIsSentAgainAfterItsConnectionBroke: with RetryIdempotent, a
// request that net/http deems idempotent (GET, or a POST with an Idempotency-Key) whose
// connection breaks once it went out is sent again; a POST without the header is not, nor is
// any request without RetryIdempotent.
func TestAnIdempotentRequestIsSentAgainAfterItsConnectionBroke(t *testing.T) {
	cases := []struct {
		name   string
		method string
		header http.Header
		opt    bool
		again  bool
	}{
		{"GET", http.MethodGet, nil, true, true},
		{"POST with an Idempotency-Key", http.MethodPost, http.Header{"Idempotency-Key": {"k1"}}, true, true},
		{"POST", http.MethodPost, nil, true, false},
		{"GET without RetryIdempotent", http.MethodGet, nil, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if calls.Add(1) == 1 {
					c, _, err := http.NewResponseController(w).Hijack()
					if assert.NoError(t, err) {
						c.Close()
					}
					return
				}
				w.WriteHeader(http.StatusNoContent)
			}))
			defer srv.Close()
			r := newTestRouter(t, RoundRobin, everywhere(t, "x"), map[assignment.NodeID]nodeInfo{"x": {address: strings.TrimPrefix(srv.URL, "http://"), capacity: 1}})
			// No connection is reused, so that net/http does not send the request again itself.
			base := &http.Transport{DisableKeepAlives: true}
			hc := &http.Client{Transport: &Transport{Router: r, Base: base, Key: pathKey, RetryIdempotent: tc.opt}}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err := send(ctx, hc, tc.method, leftKey(t), tc.header)
			if tc.again {
				require.NoError(t, err)
				assert.Equal(t, int64(2), calls.Load(), "sent again")
				assert.Equal(t, RouterStats{Retried: 1, Broken: 1}, r.Stats())
				return
			}
			assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET), "the connection broke: %v", err)
			assert.Equal(t, int64(1), calls.Load(), "not sent again")
			assert.Equal(t, RouterStats{}, r.Stats())
		})
	}
}

// TestAQuarantinedKeyFailsAtOnce: no map will serve a quarantined key until an operator
// lifts the quarantine, so a call for it fails at once rather than at its deadline.
func TestAQuarantinedKeyFailsAtOnce(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			x := p.member(t)
			a, err := assignment.New(1, []assignment.Slice{
				{Range: keyspace.Range{Start: 0, End: keyspace.At(1 << 63)}, Replicas: []assignment.NodeID{assignment.Nobody}},
				{Range: keyspace.Range{Start: 1 << 63, End: keyspace.End}, Replicas: ids("x")},
			})
			require.NoError(t, err)
			r := newTestRouter(t, RoundRobin, a, map[assignment.NodeID]nodeInfo{"x": {address: x.addr, capacity: 1}})
			call := p.caller(t, r)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			require.NoError(t, call(ctx, rightKey(t), false), "the other half is served")
			start := time.Now()
			err = call(ctx, leftKey(t), false)
			assert.Less(t, time.Since(start), 5*time.Second, "at once, not at the deadline")
			assert.Contains(t, err.Error(), "the key is quarantined")
			assert.Equal(t, 1, strings.Count(err.Error(), "client:"), "%v", err)
			if p.name == "grpc" {
				assert.Equal(t, codes.Unavailable, status.Code(err))
			} else {
				assert.ErrorIs(t, err, ErrQuarantined)
			}
		})
	}
}

// stateRecorder is a balancer.ClientConn that records the pickers it is given.
type stateRecorder struct {
	balancer.ClientConn
	pickers []balancer.Picker
}

func (c *stateRecorder) UpdateState(s balancer.State) { c.pickers = append(c.pickers, s.Picker) }

// TestTheBalancerNeverHandsGRPCAnErrorPicker: the base balancer's error picker, which fails
// calls with an Unavailable the interceptor would not try again, is replaced by a key picker
// both in TransientFailure and when the base balancer keeps it on leaving it for Connecting.
func TestTheBalancerNeverHandsGRPCAnErrorPicker(t *testing.T) {
	rec := &stateRecorder{}
	pb := &keyPickerBuilder{}
	c := &keyConn{ClientConn: rec, pb: pb}
	stale := base.NewErrPicker(errors.New("last resolver error: <nil>"))
	c.UpdateState(balancer.State{ConnectivityState: connectivity.TransientFailure, Picker: stale})
	c.UpdateState(balancer.State{ConnectivityState: connectivity.Connecting, Picker: stale})
	ready := pb.Build(base.PickerBuildInfo{})
	c.UpdateState(balancer.State{ConnectivityState: connectivity.Ready, Picker: ready})
	require.Len(t, rec.pickers, 3)
	for _, p := range rec.pickers[:2] {
		_, err := p.Pick(balancer.PickInfo{Ctx: WithKey(t.Context(), []byte("k"))})
		assert.Equal(t, noRouteReason, reasonOf(err), "the call is not sent, to be tried again: %v", err)
	}
	assert.Same(t, ready, rec.pickers[2], "the key picker's own pickers pass")
}

// TestACallToAMemberThatHangsSaysWhich sends a call to a member that takes it and never
// answers (stopped): at the call's deadline it ends with DeadlineExceeded naming the member,
// and the router counts it as expired.
func TestACallToAMemberThatHangsSaysWhich(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			hang := make(chan struct{})
			defer close(hang)
			addr := hangingMember(t, p.name, hang)
			r := newTestRouter(t, RoundRobin, everywhere(t, "x"), map[assignment.NodeID]nodeInfo{"x": {address: addr, capacity: 1}})
			call := p.caller(t, r)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second) // room to connect first
			defer cancel()
			err := call(ctx, leftKey(t), true)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Contains(t, err.Error(), "client: x at "+addr+" did not answer before the call ended")
			require.Equal(t, codes.DeadlineExceeded, status.Code(err))
			require.Equal(t, uint64(1), r.Stats().Expired)
		})
	}
}

// hangingMember starts a member's server, gRPC or HTTP, that takes every call and answers
// none until hang is closed; it returns its address.
func hangingMember(t *testing.T, kind string, hang chan struct{}) string {
	t.Helper()
	if kind == "http" {
		srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hang }))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	// A stopped process heeds no deadline: the caller's own ends the call.
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		<-hang
		return nil, errors.New("resumed")
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis) //nolint:errcheck // it returns when stopped
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}
