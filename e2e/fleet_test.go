package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/testchild"
)

// routerChildEnv, when set, makes this test binary a fleet of routers (see routerJob):
// thousands of routers, each with connections to the assigners, its relay and the next one,
// do not fit in one process's file descriptors.
const routerChildEnv = "SLICEPLANE_ROUTER_CHILD"

// fleetSettle is how long the routers run, once each has a map, before the kill: each has
// connected ahead of need to its next relay by then (client's warmSpread, 30 s, and 5 s).
const fleetSettle = 35 * time.Second

// routerSpec is what the test asks of a child: routers r<From>..r<To-1> of the assigners.
type routerSpec struct {
	From, To  int
	Assigners []string
	TLS       mtls.Config
}

// routerResult is when each of a child's routers reached the generation asked for, in
// milliseconds after the time the test gave; Behind are those that did not within 30 s.
type routerResult struct {
	Reached []float64
	Behind  int
}

// reachRequest asks a child when its routers reach generation Gen, counted from Since.
type reachRequest struct {
	Gen   uint64
	Since time.Time
}

// routerJob runs the spec's routers, says it is ready once each has a map, then answers
// each reachRequest with a routerResult.
func routerJob(s *routerSpec) func(*testchild.Parent) error {
	return func(p *testchild.Parent) error {
		ctx, cancel := context.WithCancel(context.Background())
		var routers []*client.Router
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel() // before the wait
		// 250 at a time: thousands of TLS handshakes at once on two cores outlast the
		// connection timeout, and retried, never end.
		for lo := s.From; lo < s.To; lo += 250 {
			batch, err := startRouters(ctx, &wg, *s, lo, min(lo+250, s.To))
			if err != nil {
				return err
			}
			routers = append(routers, batch...)
		}
		p.Ready()
		var req reachRequest
		for p.Recv(&req) {
			stop := testchild.Profile("SLICEPLANE_FLEET_PROFILE", fmt.Sprintf("routers-%d", s.From))
			res := reach(routers, req.Gen, req.Since)
			stop()
			if err := p.Send(res); err != nil {
				return err
			}
		}
		return nil
	}
}

// startRouters runs routers r<from>..r<to-1> until ctx ends, and returns them once each
// has a map.
func startRouters(ctx context.Context, wg *sync.WaitGroup, s routerSpec, from, to int) ([]*client.Router, error) {
	log := fleetLog()
	var routers []*client.Router
	for i := from; i < to; i++ {
		r, err := client.NewRouter(client.RouterConfig{ID: fmt.Sprintf("r%d", i), Assigners: s.Assigners,
			TLS: client.TLS{Cert: s.TLS.Cert, Key: s.TLS.Key, CA: s.TLS.CA}, Logger: log})
		if err != nil {
			return nil, err
		}
		wg.Go(func() { r.Run(ctx) })
		routers = append(routers, r)
	}
	wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, r := range routers {
		if err := r.WaitReady(wait); err != nil {
			return nil, fmt.Errorf("router %d..%d: %w", from, to, err)
		}
	}
	return routers, nil
}

// fleetLog is where a child's routers log: the file SLICEPLANE_FLEET_LOG names (each
// child appends to it), for reading a run after the fact, or nowhere.
var fleetLog = sync.OnceValue(func() *slog.Logger {
	var w io.Writer = io.Discard
	if path := os.Getenv("SLICEPLANE_FLEET_LOG"); path != "" {
		if f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err == nil {
			w = f // closed with the process
		}
	}
	return slog.New(slog.NewTextHandler(w, nil))
})

// reach waits, 30 s at most, until every router has generation gen, and returns when each
// did, after since.
func reach(routers []*client.Router, gen uint64, since time.Time) routerResult {
	at := make([]time.Duration, len(routers))
	deadline := time.Now().Add(30 * time.Second)
	for left := len(routers); left > 0 && time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		now := time.Since(since)
		for i, r := range routers {
			if at[i] == 0 && r.Generation() >= gen {
				at[i], left = now, left-1
			}
		}
	}
	var res routerResult
	for _, d := range at {
		if d == 0 {
			res.Behind++
			continue
		}
		res.Reached = append(res.Reached, float64(d.Microseconds())/1000)
	}
	return res
}

// fleetRouters is how many routers TestARelayKilledUnderItsRouters runs: its
// SLICEPLANE_FLEET_ROUTERS, or none (the test is skipped; make e2e-fleet runs 10,000).
func fleetRouters(t *testing.T) int {
	v := os.Getenv("SLICEPLANE_FLEET_ROUTERS")
	if v == "" {
		t.Skip("SLICEPLANE_FLEET_ROUTERS is not set (make e2e-fleet); client's TestRoutersWatchRelaysAndOutliveOne runs 150 routers in one process")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("SLICEPLANE_FLEET_ROUTERS=%q: want a number of routers", v)
	}
	return n
}

// A relay killed (kill -9) under thousands of routers, each process apart: two assigners,
// three distributors (the relays), a node, and the routers in processes of 3,500. No router loses
// the map: a change made right after the kill reaches every one, and the test reports when.
func TestARelayKilledUnderItsRouters(t *testing.T) {
	n := fleetRouters(t)
	ctx := t.Context()
	s := startCluster(t, ctx, 10, "n1")
	ids := quantum.Distributors{}
	for _, id := range []string{"d3"} {
		if _, err := s.cluster.StartDistributor(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range s.cluster.Members("distributor") {
		ids[m.ID] = m.Addr
	}
	tls, err := s.pki.Issue("router", "fleet")
	if err != nil {
		t.Fatal(err)
	}
	var children []*testchild.Child
	// 3,500 routers a process at most: each has 4 connections while it starts (2 assigners,
	// its relay and the next one), and a process may hold 20,000 here. One process after the
	// other: their handshakes would starve each other.
	for lo := 0; lo < n; lo += 3500 {
		c := testchild.Start(t, routerChildEnv, routerSpec{From: lo, To: min(lo+3500, n), Assigners: s.cluster.Assigners(), TLS: tls})
		c.Ready(t)
		children = append(children, c)
	}
	// The kill is to come in the fleet's steady state, not amid its start.
	time.Sleep(fleetSettle)
	s.steady(t, n)
	victim, routers := busiest(ids, n)
	m, _ := s.cluster.Member("distributor", victim)
	conn, err := s.cluster.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := pb.NewAdminServiceClient(conn)
	if _, err := admin.Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err) // connected to the leader before the kill
	}
	m.Proc().Kill()
	killed := time.Now()
	gen := split(t, admin, "after-the-kill")
	splitAt := time.Since(killed)
	var reached []float64
	behind := 0
	for _, c := range children { // all at once: each child counts from when it is asked
		c.Send(t, reachRequest{Gen: gen, Since: killed})
	}
	for _, c := range children {
		var res routerResult
		c.Recv(t, &res)
		reached, behind = append(reached, res.Reached...), behind+res.Behind
	}
	slices.Sort(reached)
	t.Logf("%d routers, %d of them on %s, killed; a split %.0f ms later: generation %d on every router within %.0f ms of the kill (p50 %.0f, p99 %.0f ms)",
		n, routers, victim, float64(splitAt.Microseconds())/1000, gen, reached[len(reached)-1], reached[len(reached)/2], reached[len(reached)*99/100])
	if behind > 0 {
		t.Fatalf("%d of %d routers did not reach generation %d within 30 s of the kill", behind, n, gen)
	}
	if err := s.cluster.Restart(ctx, m); err != nil { // and the cluster stops cleanly
		t.Fatal(err)
	}
}

// steadyWindow is how long the fleet's steady state is measured before the kill.
const steadyWindow = 5 * time.Second

// steady measures the leader's CPU over steadyWindow with the fleet running, and checks that
// the assigners hold no connection of the routers, which watch relays (dial.LeaderIdleTimeout).
func (s *scenario) steady(t *testing.T, routers int) {
	lead := s.leader()
	before, err := launch.CPUSeconds(lead.Proc().Pid())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	time.Sleep(steadyWindow) // a window to measure in, not a wait for a condition
	after, err := launch.CPUSeconds(lead.Proc().Pid())
	if err != nil {
		t.Fatal(err)
	}
	conns := map[string]float64{}
	for _, m := range s.cluster.Members("assigner") {
		conns[m.ID] = s.metric(m, "sliceplane_assigner_connections")
	}
	t.Logf("%d routers in their steady state: the leader %s used %.1f%% of a core over %s; connections each assigner holds: %v",
		routers, lead.ID, 100*(after-before)/time.Since(start).Seconds(), steadyWindow, conns)
	for id, c := range conns {
		if c >= maxAssignerConns {
			t.Errorf("assigner %s holds %.0f connections with %d routers: the routers' connections were not let go", id, c, routers)
		}
	}
}

// maxAssignerConns bounds the connections an assigner may hold from everything but the
// routers: the distributors', the node's, the test's.
const maxAssignerConns = 50

// split splits the slice holding key and returns the new generation.
func split(t *testing.T, admin pb.AdminServiceClient, key string) uint64 {
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	resp, err := admin.Split(ctx, &pb.SplitRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: []byte(key)}}}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	return resp.GetChange().GetGeneration()
}

// busiest returns the relay the most of n routers rank first, and how many.
func busiest(ids quantum.Distributors, n int) (string, int) {
	count := map[string]int{}
	for i := range n {
		count[ids.Rank(fmt.Sprintf("r%d", i))[0]]++
	}
	victim := ""
	for id, k := range count {
		if victim == "" || k > count[victim] {
			victim = id
		}
	}
	return victim, count[victim]
}
