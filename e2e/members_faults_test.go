package e2e_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	ratelimitv1 "github.com/sliceplane/sliceplane/examples/ratelimit/proto/ratelimit/v1"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// ttl returns the members' lease.
func (r *memberRun) ttl() time.Duration {
	if r.sc.nodeTTL > 0 {
		return r.sc.nodeTTL
	}
	return 10 * time.Second
}

// crash kills the member that is the primary of the most keys, or stops it (SIGSTOP) for
// four seconds past its lease and lets it go on, and measures how soon every key is served
// again, how many requests failed, and, for a stop, whether the member answered for a key it
// no longer owned once it went on.
func (r *memberRun) crash(load *memberLoad) {
	t := r.t
	victim, owned := r.victim()
	probed := r.keys
	if len(probed) > 1000 { // the victim's keys: the others were answered all along
		probed = owned
	}
	t0, before := time.Now(), r.router.Stats()
	stale := make(chan int, 1)
	switch r.sc.fault {
	case "kill":
		victim.Proc().Kill()
		stale <- 0
	case "stop":
		client := r.dialStale(victim) // a client whose connection to the member predates the stop
		defer client.Close()
		signal(t, victim, syscall.SIGSTOP)
		go func() {
			time.Sleep(r.ttl() + time.Second) // the member's lease has lapsed, its keys are others'
			answered := r.staleAnswers(victim, client, owned, 4*time.Second+r.ttl())
			time.Sleep(3 * time.Second) // the fault itself: the member is stopped this long
			signal(t, victim, syscall.SIGCONT)
			stale <- <-answered
		}()
	}
	outages := load.probe(r.ctx, probed, t0)
	staleAnswers := <-stale
	load.waitAnswered(t, int(r.sc.rate)*2)
	answered, failed, since := load.counts(t0.Add(-load.deadline()))
	var theirs, all []time.Duration
	for k, d := range outages {
		all = append(all, d)
		if slices.Contains(owned, k) {
			theirs = append(theirs, d)
		}
	}
	_, _, _, worst := quantiles(all)
	t.Logf("%s: %s of %s, the primary of %d of %d keys; served again after the fault: its keys %s; worst of all %d probed keys %s",
		r.sc.name, r.sc.fault, victim.ID, len(owned), len(r.keys), showQuantiles(theirs), len(all), worst.Round(time.Millisecond))
	t.Logf("%s: requests answered %d, failed %d (%d of them started within a deadline before the fault or after it); "+
		"answers from the stopped member for keys it no longer owned: %d; lease %s, bound %s",
		r.sc.name, answered, failed, len(since), staleAnswers, r.ttl(), r.sc.bound)
	after := r.router.Stats()
	t.Logf("%s: the router's tries again since the fault (load and probes): %d after NotOwner, %d not sent, %d after a "+
		"broken connection, over %d calls; %d calls expired", r.sc.name, after.NotOwner-before.NotOwner,
		after.NotSent-before.NotSent, after.Broken-before.Broken, after.Retried-before.Retried, after.Expired-before.Expired)
	logFailures(r, since)
	if worst > r.sc.bound {
		t.Errorf("%s: a key was served again %s after the fault, past the bound of %s", r.sc.name, worst.Round(time.Millisecond), r.sc.bound)
	}
	if staleAnswers > 0 {
		t.Errorf("%s: the stopped member answered %d requests for keys it no longer owned", r.sc.name, staleAnswers)
	}
	if r.sc.fault == "kill" { // back, as a supervisor would start it: it joins again
		if err := r.cluster.Restart(r.ctx, victim); err != nil {
			t.Errorf("restarting %s: %v", victim.ID, err)
		}
	}
}

// logFailures logs a few failed requests, for a reader of a run.
func logFailures(r *memberRun, fs []failure) {
	for i, f := range fs {
		if i == 5 {
			r.t.Logf("... and %d more", len(fs)-5)
			return
		}
		r.t.Logf("failed: %s at +%s after %s: %s %s", f.key, f.start.Format("15:04:05.000"), f.end.Sub(f.start).Round(time.Millisecond), f.code, f.msg)
	}
}

// dialStale returns a connection straight to member m, made and used once, as a client's
// that routed by the map of the moment and keeps its connection.
func (r *memberRun) dialStale(m *kvcluster.Member) *grpc.ClientConn {
	files, err := r.pki.Issue("router", "members-stale")
	if err != nil {
		r.t.Fatal(err)
	}
	src, err := files.Load()
	if err != nil {
		r.t.Fatal(err)
	}
	conn, err := grpc.NewClient(m.Addr, src.DialOption("node"))
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	if _, err := ratelimitv1.NewRateLimitServiceClient(conn).Peek(ctx, &ratelimitv1.PeekRequest{Key: "stale"}, grpc.WaitForReady(true)); err != nil &&
		!client.IsNotOwner(err) {
		r.t.Fatalf("connecting to %s: %v", m.ID, err)
	}
	return conn
}

// staleAnswers sends, on conn, a request for each of keys straight to member m while it is
// stopped past its lease, as a client with an old map would: they wait in the connection and
// reach m as it goes on. It returns, once they ended (within deadline), how many m answered
// for a key whose primary the router names another member by then: none may be.
func (r *memberRun) staleAnswers(m *kvcluster.Member, conn *grpc.ClientConn, keys []string, deadline time.Duration) <-chan int {
	svc := ratelimitv1.NewRateLimitServiceClient(conn)
	out := make(chan int, 1)
	var wrong atomic.Int64
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.ctx, deadline)
			defer cancel()
			_, err := svc.Take(ctx, &ratelimitv1.TakeRequest{Key: key})
			if rep, perr := r.router.Primary([]byte(key)); err == nil && perr == nil && rep.ID != m.ID {
				wrong.Add(1)
			}
		})
	}
	go func() { wg.Wait(); out <- int(wrong.Load()) }()
	return out
}

// roll restarts every member in turn (SIGTERM: it drains, then starts again), under the
// load, and checks that no request failed and, from the members' logs, that every release
// came after the range's new primary took the role; it reports how long each range had no
// primary.
func (r *memberRun) roll(load *memberLoad) {
	t := r.t
	t0 := time.Now()
	for _, m := range r.members {
		if err := r.cluster.Roll(r.ctx, m); err != nil {
			t.Fatal(err)
		}
		r.waitPrimaries()
		load.waitAnswered(t, int(r.sc.rate))
	}
	load.waitAnswered(t, int(r.sc.rate)*2)
	answered, _, failed := load.counts(t0)
	var logs []string
	for _, m := range r.members {
		logs = append(logs, m.Proc().LogPath)
	}
	h, err := readHandovers(logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: a rolling restart of %d members: requests answered %d, failed %d; no primary (a demotion's start to the "+
		"promotion's end): %s; releases checked %d, before the new primary took the role %d",
		r.sc.name, len(r.members), answered, len(failed), showQuantiles(h.windows), h.releases, len(h.early))
	t.Logf("%s: the members' application calls, from their start to the handling of their answer: %s; of it the library's "+
		"own, without the wait for requests in flight and the application's time: %s", r.sc.name, showQuantiles(h.calls),
		showQuantiles(h.own))
	logFailures(r, failed)
	for _, l := range h.longest {
		t.Logf("longest without a primary: %s", l)
	}
	for i, e := range h.early {
		if i == 5 {
			break
		}
		t.Logf("early release: %s", e)
	}
	if len(failed) > 0 {
		t.Errorf("%s: %d requests failed in a planned restart", r.sc.name, len(failed))
	}
	if len(h.early) > 0 {
		t.Errorf("%s: %d releases came before the new primary took the role", r.sc.name, len(h.early))
	}
}

// cpuWindow is how long the members' CPU is measured, idle and under the load.
const cpuWindow = 10 * time.Second

// cpuOver returns each member's CPU, in cores, over the next window.
func (r *memberRun) cpuOver(window time.Duration) []float64 {
	before := make([]float64, len(r.members))
	for i, m := range r.members {
		before[i] = r.cpuSeconds(m)
	}
	start := time.Now()
	time.Sleep(window) // the measurement itself: the members run, measured, for the window
	out := make([]float64, len(r.members))
	for i, m := range r.members {
		out[i] = (r.cpuSeconds(m) - before[i]) / time.Since(start).Seconds()
	}
	return out
}

func (r *memberRun) cpuSeconds(m *kvcluster.Member) float64 {
	s, err := launch.CPUSeconds(m.Proc().Pid())
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// reportCPU logs the members' CPU idle (holding their ranges, heartbeating, following the
// map: the library alone) and under the load (the library, gRPC, TLS and the application),
// and the slices each holds.
func (r *memberRun) reportCPU(idle, loaded []float64) {
	held := r.slicesHeld()
	for i, m := range r.members {
		r.t.Logf("%s: %s holds %d slices: CPU idle %.2f%% of a core, under %.0f requests a second over %d members %.2f%%",
			r.sc.name, m.ID, held[m.ID], 100*idle[i], r.sc.rate, len(r.members), 100*loaded[i])
	}
}

// slicesHeld returns how many slices each member holds, by the assigner.
func (r *memberRun) slicesHeld() map[string]uint32 {
	conn, err := r.cluster.Dial()
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	resp, err := pb.NewAdminServiceClient(conn).ListNodes(ctx, &pb.ListNodesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, n := range resp.GetNodes() {
		out[n.GetNode().GetId()] = n.GetSlices()
	}
	return out
}
