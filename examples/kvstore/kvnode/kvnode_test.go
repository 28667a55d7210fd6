package kvnode_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcheck"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvnode"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startNode runs a kvnode in the test's process until the test ends.
func startNode(t *testing.T, c *clustertest.Cluster, id string) *kvclient.Node {
	t.Helper()
	srv, err := kvnode.New(kvnode.Config{ID: id, Listen: "127.0.0.1:0", Assigners: c.Assigners(), DataDir: t.TempDir(),
		ReportInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node %s: %v", id, err)
		}
	})
	return kvclient.New(srv.Addr(), nil)
}

func TestNodesServeTheirKeysAndNameTheOwnersOfOthers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clustertest.New(t, clustertest.Options{})
	c.StartDistributor("d1")
	nodes := []*kvclient.Node{startNode(t, c, "k1"), startNode(t, c, "k2")}
	w := writer.New(etcdtest.Client(t, c.Etcd), writer.DefaultPrefix)
	const items = 200
	for i := range items {
		if _, err := w.Put(ctx, fmt.Appendf(nil, "key-%d", i), fmt.Appendf(nil, "value-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Reads make load, which the assigner balances by giving the second node slices (the
	// first may have taken them all when it joined alone). Then each node must hold exactly
	// its share: the checker reads them over HTTP.
	err := launch.WaitFor(ctx, "two nodes in the map", 50*time.Millisecond, func(ctx context.Context) error {
		for i := range items {
			for _, n := range nodes {
				n.Get(ctx, fmt.Appendf(nil, "key-%d", i)) //nolint:errcheck // only the load counts here
			}
		}
		a, _, err := c.Assignment(ctx)
		if err != nil {
			return err
		}
		held := map[assignment.NodeID]bool{}
		for _, s := range a.All() {
			for _, id := range s.Replicas {
				held[id] = true
			}
		}
		if len(held) != 2 {
			return fmt.Errorf("%d nodes hold slices", len(held))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A still map, so that no slice is between two nodes while the test reads: frozen, and
	// the handoffs the last passes began (a replica loading) ended.
	admin := pb.NewAdminServiceClient(c.Conn())
	if _, err := admin.Freeze(ctx, &pb.FreezeRequest{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	err = launch.WaitFor(ctx, "no handoff under way", 50*time.Millisecond, func(ctx context.Context) error {
		st, err := admin.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			return err
		}
		if n := st.GetHandoffs(); n > 0 {
			return fmt.Errorf("%d slices in handoff", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checker := &kvcheck.Checker{Source: c.Source, Assigner: c.Conn(), Nodes: nodes}
	r, err := checker.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Items != items+1 {
		t.Fatalf("checked %d items, want %d and the fence", r.Items, items)
	}

	checkKeysServedByTheirHolders(t, ctx, c, nodes, items)
	checkRoutedReads(t, ctx, c, items)
	checkStateAndMetrics(t, ctx, nodes[0])
}

// checkKeysServedByTheirHolders checks that every key is served by the nodes that hold its
// slice in the frozen map (a hot slice may have a replica on each); a node that does not hold
// it answers 421 naming its holders.
func checkKeysServedByTheirHolders(t *testing.T, ctx context.Context, c *clustertest.Cluster, nodes []*kvclient.Node, items int) {
	frozen, _, err := c.Assignment(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var unnamed [][]byte // keys whose owners were named without an address
	for i := range items {
		key := fmt.Appendf(nil, "key-%d", i)
		_, slice := frozen.Lookup(client.Hash(key))
		var served int
		var owners []kvclient.Owner
		for _, n := range nodes {
			v, _, err := n.Get(ctx, key)
			var nm *kvclient.NotMineError
			switch {
			case err == nil:
				served++
				if want := fmt.Sprintf("value-%d", i); string(v) != want {
					t.Errorf("%s: %q = %q, want %q", n.URL(), key, v, want)
				}
			case errors.As(err, &nm):
				owners = nm.Owners
			default:
				t.Fatalf("%s: reading %q: %v", n.URL(), key, err)
			}
		}
		holders := len(slice.Replicas)
		if served != holders {
			t.Fatalf("%q: served by %d nodes; its slice has %d replicas", key, served, holders)
		}
		if holders < len(nodes) && len(owners) != holders {
			t.Fatalf("%q: %d owners named by the node that does not hold it, want %d", key, len(owners), holders)
		}
		if !slices.ContainsFunc(owners, func(o kvclient.Owner) bool { return o.Address == "" }) {
			continue
		}
		unnamed = append(unnamed, key)
	}
	// A node's router learns a new node's address when it reads the node list again, which
	// a map naming an unknown node makes it do at once; the relay it reads has a copy of the
	// list up to a second old, so the address may come a read later: within seconds.
	deadline := time.Now().Add(10 * time.Second)
	for len(unnamed) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d keys' owners still named without their addresses after 10 s; %q first", len(unnamed), unnamed[0])
		}
		time.Sleep(50 * time.Millisecond)
		unnamed = slices.DeleteFunc(unnamed, func(key []byte) bool { return ownersNamed(ctx, nodes, key) })
	}
}

// ownersNamed reports whether every node that does not hold key names its owners each
// with an address.
func ownersNamed(ctx context.Context, nodes []*kvclient.Node, key []byte) bool {
	for _, n := range nodes {
		_, _, err := n.Get(ctx, key)
		var nm *kvclient.NotMineError
		if errors.As(err, &nm) && slices.ContainsFunc(nm.Owners, func(o kvclient.Owner) bool { return o.Address == "" }) {
			return false
		}
	}
	return true
}

// checkRoutedReads checks that, through a router, every read lands on the owner at once: the
// map is still.
func checkRoutedReads(t *testing.T, ctx context.Context, c *clustertest.Cluster, items int) {
	router, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	routed := make(chan error, 1)
	go func() { routed <- router.Run(rctx) }()
	defer func() { rcancel(); <-routed }()
	if err := router.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// Ready is the map; the nodes' addresses come from a listing of its own, which may be
	// a moment later on a busy machine.
	err = launch.WaitFor(ctx, "the router knows where the nodes are", 10*time.Millisecond, func(context.Context) error {
		for i := range items {
			if rep, err := router.Pick(fmt.Appendf(nil, "key-%d", i)); err != nil || rep.Address == "" {
				return fmt.Errorf("no address for %s (%v)", rep.ID, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pool := kvclient.NewPool(nil)
	for i := range items {
		key := fmt.Appendf(nil, "key-%d", i)
		v, _, rep, redirected, err := pool.Read(ctx, router, key)
		if err != nil || redirected || string(v) != fmt.Sprintf("value-%d", i) {
			t.Fatalf("reading %q through the router: %q from %s, redirected %v: %v", key, v, rep.ID, redirected, err)
		}
	}

}

// checkStateAndMetrics checks that a key k1 owns but does not hold is 404, not an error, that
// its state names it, and that it serves metrics.
func checkStateAndMetrics(t *testing.T, ctx context.Context, k1 *kvclient.Node) {
	st, err := k1.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.ID != "k1" || st.Clock == 0 || len(st.Slices) == 0 {
		t.Errorf("state %+v", st)
	}
	for i := 0; ; i++ {
		key := fmt.Appendf(nil, "absent-%d", i)
		if _, _, err := k1.Get(ctx, key); errors.Is(err, kvclient.ErrNotFound) {
			break
		} else if i > 100 {
			t.Fatalf("no absent key owned by k1 in 100 tries; last: %v", err)
		}
	}
	resp, err := http.Get(k1.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics: %s", resp.Status)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := kvnode.New(kvnode.Config{ID: "k1", Assigners: []string{"127.0.0.1:1"}}); err == nil {
		t.Error("no data directory: want an error")
	}
	if _, err := kvnode.New(kvnode.Config{ID: "k1", DataDir: t.TempDir()}); err == nil {
		t.Error("no assigners: want an error")
	}
	if _, err := kvnode.New(kvnode.Config{ID: "", DataDir: t.TempDir(), Assigners: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0"}); err == nil {
		t.Error("no ID: want an error")
	}
}

// runNode runs srv until the test ends.
func runNode(t *testing.T, srv *kvnode.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node: %v", err)
		}
	})
}

func TestWithTLSTheNodeServesOnlyClientsWithACertificate(t *testing.T) {
	pki, err := launch.NewPKI(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	nodeTLS, err := pki.Issue("node", "k1")
	if err != nil {
		t.Fatal(err)
	}
	// No assigner answers: the HTTP API serves anyway, which is all this test looks at.
	srv, err := kvnode.New(kvnode.Config{ID: "k1", Listen: "127.0.0.1:0", Assigners: []string{"127.0.0.1:1"},
		DataDir: t.TempDir(), TLS: nodeTLS})
	if err != nil {
		t.Fatal(err)
	}
	runNode(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	viewer, err := pki.Source("viewer", "v")
	if err != nil {
		t.Fatal(err)
	}
	hc := kvclient.HTTPClient(viewer, 10*time.Second)
	if st, err := kvclient.New(srv.Addr(), hc).State(ctx); err != nil || st.ID != "k1" {
		t.Fatalf("a client with a certificate: state %+v, %v", st, err)
	}
	if got := kvclient.New(srv.Addr(), hc).URL(); got != "https://"+srv.Addr() {
		t.Errorf("URL %q, want https", got)
	}
	// No client certificate: the handshake fails. (The server's chain is trusted here, so
	// only the missing certificate is at stake.)
	noCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: caPool(t, nodeTLS.CA)}}}
	if _, err := kvclient.New("https://"+srv.Addr(), noCert).State(ctx); err == nil {
		t.Error("a client without a certificate was served")
	}
	// Plaintext gets a refusal, not the state.
	if _, err := kvclient.New("http://"+srv.Addr(), nil).State(ctx); err == nil {
		t.Error("a plaintext client was served")
	}
	// A certificate from another CA is refused too.
	other, err := launch.NewPKI(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.Source("viewer", "v")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvclient.New(srv.Addr(), kvclient.HTTPClient(stranger, 10*time.Second)).State(ctx); err == nil {
		t.Error("a client of another CA was served")
	}
}

func caPool(t *testing.T, path string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatalf("%s holds no certificate", path)
	}
	return p
}

func TestAPlaintextNodeServesOnLoopbackOnly(t *testing.T) {
	_, err := kvnode.New(kvnode.Config{ID: "k1", Listen: "0.0.0.0:0", Assigners: []string{"127.0.0.1:1"}, DataDir: t.TempDir()})
	if !errors.Is(err, mtls.ErrConfig) {
		t.Fatalf("plaintext on every interface: %v, want refused", err)
	}
	// (--insecure would let it by; tests listen on loopback only, so it is not tried here.)
	srv, err := kvnode.New(kvnode.Config{ID: "k1", Listen: "127.0.0.1:0", Assigners: []string{"127.0.0.1:1"}, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	runNode(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := kvclient.New(srv.Addr(), nil).State(ctx); err != nil {
		t.Fatalf("plaintext on loopback: %v", err)
	}
}
