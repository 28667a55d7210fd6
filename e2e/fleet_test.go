package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// routerChildEnv, when set, makes this test binary a fleet of routers (see runRouterChild):
// thousands of routers, each with connections to the assigners, its relay and the next one,
// do not fit in one process's file descriptors.
const routerChildEnv = "SLICEPLANE_ROUTER_CHILD"

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
	Err     string
}

// runRouterChild runs the spec's routers, prints "ready" once each has a map, then for
// each line "GEN UNIXNANO" on its input prints a routerResult as JSON. It returns the exit
// code.
func runRouterChild(spec string) int {
	var s routerSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Println(`{"Err":"spec"}`)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	var routers []*client.Router
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the wait
	// 250 at a time: thousands of TLS handshakes at once on two cores outlast the connection
	// timeout, and retried, never end.
	for lo := s.From; lo < s.To; lo += 250 {
		batch, err := startRouters(ctx, &wg, s, lo, min(lo+250, s.To))
		if err != nil {
			json.NewEncoder(os.Stdout).Encode(routerResult{Err: err.Error()})
			return 1
		}
		routers = append(routers, batch...)
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var gen uint64
		var since int64
		if _, err := fmt.Sscan(in.Text(), &gen, &since); err != nil {
			return 1
		}
		json.NewEncoder(os.Stdout).Encode(reach(routers, gen, time.Unix(0, since)))
	}
	return 0
}

// startRouters runs routers r<from>..r<to-1> until ctx ends, and returns them once each
// has a map.
func startRouters(ctx context.Context, wg *sync.WaitGroup, s routerSpec, from, to int) ([]*client.Router, error) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
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

// routerChild is the test's side of a child fleet of routers.
type routerChild struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startRouterChild(t *testing.T, s routerSpec) *routerChild {
	spec, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	c := &routerChild{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	c.cmd.Env = append(os.Environ(), routerChildEnv+"="+string(spec))
	c.cmd.Stderr = os.Stderr
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.in.Close(); c.cmd.Process.Kill(); c.cmd.Wait() })
	c.out = bufio.NewScanner(stdout)
	return c
}

// ready waits for the child's routers to have a map.
func (c *routerChild) ready(t *testing.T) {
	if !c.out.Scan() || c.out.Text() != "ready" {
		t.Fatalf("the routers' process did not get ready: %s", c.out.Text())
	}
}

// reached asks the child when its routers reached gen, after since.
func (c *routerChild) reached(t *testing.T, gen uint64, since time.Time) routerResult {
	fmt.Fprintf(c.in, "%d %d\n", gen, since.UnixNano())
	var res routerResult
	if !c.out.Scan() || json.Unmarshal(c.out.Bytes(), &res) != nil {
		t.Fatalf("the routers' process did not answer: %s", c.out.Text())
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
	var children []*routerChild
	// 3,500 routers a process at most: each has 4 connections (2 assigners, its relay and the
	// next one), and a process may hold 20,000 here. One process after the other: their
	// handshakes would starve each other.
	for lo := 0; lo < n; lo += 3500 {
		c := startRouterChild(t, routerSpec{From: lo, To: min(lo+3500, n), Assigners: s.cluster.Assigners(), TLS: tls})
		c.ready(t)
		children = append(children, c)
	}
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
	for _, c := range children {
		res := c.reached(t, gen, killed)
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
