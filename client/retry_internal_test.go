package client

// Tests of how the Transport and the gRPC interceptor try a call again: against fake
// members in the test process, with a router fed maps by the test (no assigner), so that the
// test decides when the key's route changes and when only other slices' do.

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// fakeMember is a member's server, gRPC or HTTP, that counts the calls it gets.
type fakeMember struct {
	addr  string
	calls atomic.Int64
}

// grpcMember starts a fake member serving the gRPC health service.
func grpcMember(t *testing.T) *fakeMember {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m := &fakeMember{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		m.calls.Add(1)
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
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		m.calls.Add(1)
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
