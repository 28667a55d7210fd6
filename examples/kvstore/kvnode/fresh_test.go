package kvnode_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvnode"
)

// freshState is a node's freshness as a test sets it.
type freshState struct {
	ok     bool
	reason string
}

// A node beyond its freshness bound answers reads 503 giving kvclient.BeyondFreshness and
// why, and says so on /healthz; back within the bound, it answers from its data again.
func TestANodeBeyondItsFreshnessBoundAnswersNoReads(t *testing.T) {
	srv, err := kvnode.New(kvnode.Config{ID: "k1", Listen: "127.0.0.1:0", Assigners: []string{"127.0.0.1:1"}, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var state atomic.Pointer[freshState]
	state.Store(&freshState{ok: false, reason: "distributor silent for 4s (bound 3s)"})
	srv.SetFresh(func() (bool, string) { s := state.Load(); return s.ok, s.reason })
	runNode(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node := kvclient.New(srv.Addr(), nil)

	_, _, err = node.Get(ctx, []byte("k"))
	var stale *kvclient.StaleError
	if !errors.As(err, &stale) {
		t.Fatalf("a read of a stale node: want a StaleError, got %v", err)
	}
	if !strings.Contains(stale.Reason, "distributor silent for 4s") {
		t.Errorf("the 503 does not say why: %q", stale.Reason)
	}
	if body := get(t, ctx, srv.Addr(), "/healthz"); !strings.Contains(body, kvclient.BeyondFreshness) || !strings.Contains(body, "silent") {
		t.Errorf("/healthz does not say the node is beyond its bound: %q", body)
	}
	if body := get(t, ctx, srv.Addr(), "/metrics"); !strings.Contains(body, "kvstore_node_beyond_freshness 1") ||
		!strings.Contains(body, `kvstore_node_reads_total{outcome="stale"} 1`) {
		t.Errorf("the metrics do not count the stale read:\n%s", body)
	}

	state.Store(&freshState{ok: true})
	// Fresh again, the node answers from what it holds: no slice yet, so not its key.
	_, _, err = node.Get(ctx, []byte("k"))
	var notMine *kvclient.NotMineError
	if !errors.As(err, &notMine) {
		t.Fatalf("a read of a fresh node holding nothing: want a NotMineError, got %v", err)
	}
	if body := get(t, ctx, srv.Addr(), "/healthz"); strings.Contains(body, kvclient.BeyondFreshness) {
		t.Errorf("/healthz of a fresh node: %q", body)
	}
}

// get returns the body of a GET of path on addr.
func get(t *testing.T, ctx context.Context, addr, path string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
