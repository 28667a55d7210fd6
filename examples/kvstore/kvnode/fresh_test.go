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

	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvnode"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// freshState is a node's freshness as a test sets it.
type freshState struct {
	ok     bool
	reason string
}

// A node beyond its freshness bound answers reads of its keys 503 giving
// kvclient.BeyondFreshness and why, and says so on /healthz; back within the bound, it
// answers from its data again.
func TestANodeBeyondItsFreshnessBoundAnswersNoReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clustertest.New(t, clustertest.Options{})
	c.StartDistributor("d1")
	srv, err := kvnode.New(kvnode.Config{ID: "k1", Listen: "127.0.0.1:0", Assigners: c.Assigners(), DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var state atomic.Pointer[freshState]
	state.Store(&freshState{ok: true})
	srv.SetFresh(func() (bool, string) { s := state.Load(); return s.ok, s.reason })
	runNode(t, srv)
	node := kvclient.New(srv.Addr(), nil)
	key := []byte("k")
	if _, err := writer.New(etcdtest.Client(t, c.Etcd), writer.DefaultPrefix).Put(ctx, key, []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := launch.WaitFor(ctx, "k1 serves the key", 20*time.Millisecond, func(ctx context.Context) error {
		_, _, err := node.Get(ctx, key)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	state.Store(&freshState{ok: false, reason: "distributor silent for 4s (bound 3s)"})
	_, _, err = node.Get(ctx, key)
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
		!strings.Contains(body, `kvstore_node_reads_total{outcome="stale"}`) {
		t.Errorf("the metrics do not count the stale read:\n%s", body)
	}

	state.Store(&freshState{ok: true})
	if v, _, err := node.Get(ctx, key); err != nil || string(v) != "v" {
		t.Fatalf("a read of a fresh node again: %q, %v", v, err)
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
