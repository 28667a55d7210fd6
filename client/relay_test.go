package client_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// relayFleet is a cluster of one assigner (clustertest's), three distributors (the relays) and one node,
// over mutual TLS, with routers that share one router certificate.
type relayFleet struct {
	c        *clustertest.Cluster
	mu       sync.Mutex
	regs     map[string]*prometheus.Registry // each distributor's metrics, by ID
	leader   *prometheus.Registry
	routers  []*client.Router
	routerTL client.TLS
	router   mtls.Config // routerTL, for the raw watchers that load it themselves
}

func startRelayFleet(t testing.TB) *relayFleet { return startRelayFleetWith(t, nil) }

// startRelayFleetWith starts a relay fleet whose node is configured by node too (nil: as
// clustertest does).
func startRelayFleetWith(t testing.TB, node func(*client.NodeConfig)) *relayFleet {
	f := &relayFleet{regs: map[string]*prometheus.Registry{}, leader: prometheus.NewRegistry()}
	f.c = clustertest.New(t, clustertest.Options{TLS: true, Node: node,
		Assigner: func(cfg *assigner.Config) { cfg.Registry = f.leader },
		Distributor: func(cfg *distributor.Config) {
			reg := prometheus.NewRegistry()
			cfg.Registry = reg
			f.mu.Lock()
			f.regs[cfg.ID] = reg
			f.mu.Unlock()
		}})
	for _, id := range []string{"d1", "d2", "d3"} {
		f.c.StartDistributor(id)
	}
	f.c.StartNode("n1", nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := f.c.WaitConverged(ctx)
	require.NoError(t, err, "the node holds the first map")
	f.router = f.c.PKI.Config("router", "fleet")
	f.routerTL = tlsOf(f.router)
	return f
}

// start runs n routers, named r0..r<n-1>, and waits for each to have a map. They start 25
// at a time: a hundred and fifty TLS handshakes at once under the race detector on a busy
// machine outlast the connection timeout, and retried, did not end within a minute.
func (f *relayFleet) start(t *testing.T, n int) {
	for lo := 0; lo < n; lo += 25 {
		var batch []*client.Router
		for i := lo; i < min(lo+25, n); i++ {
			r, err := client.NewRouter(client.RouterConfig{ID: fmt.Sprintf("r%d", i), Assigners: f.c.Assigners(), TLS: f.routerTL, Logger: quiet()})
			require.NoError(t, err)
			runRouter(t, r)
			f.routers = append(f.routers, r)
			batch = append(batch, r)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		for _, r := range batch {
			require.NoError(t, r.WaitReady(ctx))
		}
		cancel()
	}
}

// watchers returns how many watches each distributor relays.
func (f *relayFleet) watchers(t *testing.T) map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for id, reg := range f.regs {
		out[id] = int(gauge(t, reg, "sliceplane_distributor_relay_watchers"))
	}
	return out
}

func gauge(t testing.TB, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// behind returns how many routers have not applied generation gen yet.
func (f *relayFleet) behind(gen uint64) int {
	n := 0
	for _, r := range f.routers {
		if r.Generation() < gen {
			n++
		}
	}
	return n
}

// split splits the slice holding key through the leader and returns the new generation.
func (f *relayFleet) split(t testing.TB, key string) uint64 {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewAdminServiceClient(f.c.Conn()).Split(ctx, &pb.SplitRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: []byte(key)}}},
		grpc.WaitForReady(true))
	require.NoError(t, err)
	return resp.GetChange().GetGeneration()
}

// relayWatchers is how many routers the relay tests run; SLICEPLANE_RELAY_WATCHERS raises it.
func relayWatchers(t testing.TB) int {
	if v := os.Getenv("SLICEPLANE_RELAY_WATCHERS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return 150
}

// Routers watch the distributors, not the assigner, spread by rendezvous hashing; when a
// relay dies, its routers resume from another and none of them loses the map: a change made
// right after the kill reaches every router.
func TestRoutersWatchRelaysAndOutliveOne(t *testing.T) {
	f := startRelayFleet(t)
	n := relayWatchers(t)
	// The distributors', the node's and the test's; a few more may come (a connection made
	// late, or for a call), not one per router.
	held := gauge(t, f.leader, "sliceplane_assigner_connections")
	f.start(t, n)
	require.Eventually(t, func() bool {
		w := f.watchers(t)
		return w["d1"]+w["d2"]+w["d3"] == n
	}, 30*time.Second, 20*time.Millisecond, "every router watches a relay")
	w := f.watchers(t)
	for id, k := range w {
		assert.Greater(t, k, n/6, "rendezvous hashing spreads the routers: %s has %d of %d", id, k, n)
	}
	// The leader counts a router's first watch, of the leader itself, until it sees the
	// stream end, a moment after the router moved.
	require.Eventually(t, func() bool { return gauge(t, f.leader, "sliceplane_assigner_watchers") == 3 }, 10*time.Second, 20*time.Millisecond,
		"only the distributors watch the leader")
	// Nor do the routers hold connections to it: a connection to the assigners closes once
	// idle (dial.LeaderIdleTimeout), and a router watching a relay leaves it idle.
	require.Eventually(t, func() bool { return gauge(t, f.leader, "sliceplane_assigner_connections") <= held+10 },
		4*dial.LeaderIdleTimeout, 20*time.Millisecond, "the leader holds about the %v connections it held before %d routers came", held, n)

	victim, most := "", -1
	for id, k := range w {
		if k > most {
			victim, most = id, k
		}
	}
	before := f.routers[0].Generation()
	f.c.Distributors()[victim].Stop()
	start := time.Now()
	gen := f.split(t, "after-the-kill")
	require.Greater(t, gen, before)
	require.Eventually(t, func() bool { return f.behind(gen) == 0 }, 20*time.Second, 5*time.Millisecond,
		"every router has the change made after its relay died")
	t.Logf("%d routers, %d of them on the stopped relay %s: all at generation %d %s after the stop",
		n, most, victim, gen, time.Since(start).Round(time.Millisecond))
	require.Eventually(t, func() bool {
		w := f.watchers(t)
		sum := 0
		for id, k := range w {
			if id != victim {
				sum += k
			}
		}
		return sum == n
	}, 30*time.Second, 20*time.Millisecond, "the stopped relay's routers watch the others")
}

// With no relay left, routers watch the assigner, and go back to a relay once one returns.
func TestRoutersFallBackToTheAssigner(t *testing.T) {
	f := startRelayFleet(t)
	f.start(t, 5)
	for _, p := range f.c.Distributors() {
		p.Stop()
	}
	gen := f.split(t, "no-relay")
	require.Eventually(t, func() bool { return f.behind(gen) == 0 }, 20*time.Second, 5*time.Millisecond,
		"the routers follow the assigner with every relay gone")
	f.c.StartDistributor("d4")
	require.Eventually(t, func() bool { return f.watchers(t)["d4"] == 5 }, 30*time.Second, 20*time.Millisecond,
		"a relay that comes back takes its routers back from the assigner")
	gen = f.split(t, "relay-again")
	require.Eventually(t, func() bool { return f.behind(gen) == 0 }, 20*time.Second, 5*time.Millisecond)
}

// A router that watches a relay learns the nodes' addresses from its stream, without reading
// the node list: a node that came back at another address is routed to there, though the
// router would read the list only once an hour.
func TestARouterLearnsNodeAddressesFromItsRelay(t *testing.T) {
	var addr atomic.Value
	addr.Store("127.0.0.1:1")
	f := startRelayFleetWith(t, func(cfg *client.NodeConfig) { cfg.Address = addr.Load().(string) })
	r, err := client.NewRouter(client.RouterConfig{ID: "r0", Assigners: f.c.Assigners(), TLS: f.routerTL, RefreshInterval: time.Hour, Logger: quiet()})
	require.NoError(t, err)
	runRouter(t, r)
	f.routers = append(f.routers, r)
	require.Eventually(t, func() bool {
		w := f.watchers(t)
		return w["d1"]+w["d2"]+w["d3"] == 1
	}, 30*time.Second, 20*time.Millisecond, "the router watches a relay")
	require.Eventually(t, func() bool { return addressOf(r, "n1") == "127.0.0.1:1" }, 10*time.Second, 10*time.Millisecond)

	f.c.Nodes()["n1"].Stop()
	addr.Store("127.0.0.1:2")
	f.c.StartNode("n1", nil)
	require.Eventually(t, func() bool { return addressOf(r, "n1") == "127.0.0.1:2" }, 20*time.Second, 10*time.Millisecond,
		"the relay's stream tells the router n1's new address")
}

// addressOf returns the address r routes node id's reads to, "" while its map names no
// such replica.
func addressOf(r *client.Router, id string) string {
	rt, err := r.LookupHash(0)
	if err != nil {
		return ""
	}
	for _, rep := range rt.Replicas {
		if rep.ID == id {
			return rep.Address
		}
	}
	return ""
}
