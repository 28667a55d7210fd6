package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	ratelimitv1 "github.com/sliceplane/sliceplane/examples/ratelimit/proto/ratelimit/v1"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// memberScenario is one run of TestMembersUnderFaults: a cluster of rate-limiter members
// (examples/ratelimit, primary and secondary roles, exclusive), a load through the Go router
// inside grpc-go, and one fault.
type memberScenario struct {
	name          string
	members, keys int
	rate          float64       // requests a second
	nodeTTL       time.Duration // the assigner's --node-ttl; 0: its default, 10 s
	minReplicas   int           // the assigner's --min-replicas; 0: its default, 1
	deadline      time.Duration // each request's; 0: 2 s
	// fault is kill (-9), stop (SIGSTOP past the lease, then SIGCONT), roll (a rolling
	// restart), or cpu (none: the members' CPU is measured idle, then under the load).
	fault string
	// slicesPerMember sets Weighted-Move's initial_slices_per_node (0: its default).
	slicesPerMember int
	// bound is how soon after the fault every key must be served again (0: no fault that
	// leaves keys unserved: a planned one, where no request may fail).
	bound time.Duration
}

// memberScenarios are the scenarios, at the default lease; a name with -ttlN runs one with
// --node-ttl Ns, its bound as much shorter. make test runs quickMemberScenarios, make
// e2e-members allMemberScenarios.
var memberScenarios = []memberScenario{
	{name: "kill", members: 3, keys: 200, rate: 100, fault: "kill", bound: 11 * time.Second},
	{name: "stop", members: 3, keys: 200, rate: 100, fault: "stop", bound: 11 * time.Second},
	{name: "kill-warm", members: 3, keys: 200, rate: 100, minReplicas: 2, fault: "kill", bound: 10500 * time.Millisecond},
	{name: "kill-10", members: 10, keys: 10000, rate: 2000, deadline: 15 * time.Second, fault: "kill", bound: 11 * time.Second},
	{name: "roll", members: 3, keys: 200, rate: 100, fault: "roll"},
	{name: "cpu", members: 2, keys: 1000, rate: 1000, fault: "cpu", slicesPerMember: 500},
}

// quickMemberScenarios run in make test: a crash and a rolling restart, with a short lease.
const (
	quickMemberScenarios = "kill-ttl2,roll-ttl2"
	allMemberScenarios   = "kill,kill-ttl2,stop,stop-ttl2,kill-warm,roll,kill-10,cpu"
)

// TestMembersUnderFaults runs members of the example rate limiter as processes of their own
// under a load, breaks one (kill -9, SIGSTOP past its lease) or restarts them all in turn,
// and measures what the load saw, by the user's clock: how long after the fault each key was
// served again (a probe per key, started at the fault, that the router sends on until it is
// answered), how many requests failed, and, for planned moves, how long each range had no
// primary and whether any member released a range before its new primary took the role (the
// members' own logs). It fails when a key is served again later than the scenario's bound,
// when a planned move fails a request, when a stopped member answers for a key after its
// lease, or when a release comes before its promotion.
//
// SLICEPLANE_MEMBERS picks the scenarios: names separated by commas, or "all"
// (allMemberScenarios; default quickMemberScenarios); a name may end in -ttlN to run it with
// --node-ttl Ns.
func TestMembersUnderFaults(t *testing.T) {
	scenarios, err := pickMemberScenarios(os.Getenv("SLICEPLANE_MEMBERS"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bin := buildBinaries(t, ctx)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { runMemberScenario(t, ctx, bin, sc) })
	}
}

// pickMemberScenarios returns the scenarios names lists ("" the quick ones, "all" every one).
func pickMemberScenarios(names string) ([]memberScenario, error) {
	if names == "all" {
		names = allMemberScenarios
	}
	if names == "" {
		names = quickMemberScenarios
	}
	var out []memberScenario
	for name := range strings.SplitSeq(names, ",") {
		base, ttl, _ := strings.Cut(name, "-ttl")
		i := slices.IndexFunc(memberScenarios, func(s memberScenario) bool { return s.name == base })
		if i < 0 {
			return nil, fmt.Errorf("SLICEPLANE_MEMBERS: no scenario %q", name)
		}
		sc := memberScenarios[i]
		if ttl != "" {
			secs, err := strconv.Atoi(ttl)
			if err != nil || secs <= 0 {
				return nil, fmt.Errorf("SLICEPLANE_MEMBERS: %q: want NAME-ttlN, N seconds", name)
			}
			sc.name, sc.nodeTTL = name, time.Duration(secs)*time.Second
			if sc.bound > 0 {
				sc.bound = sc.nodeTTL + sc.bound - 10*time.Second
			}
		}
		out = append(out, sc)
	}
	return out, nil
}

// memberRun is one scenario's cluster and load.
type memberRun struct {
	t       *testing.T
	ctx     context.Context
	sc      memberScenario
	cluster *kvcluster.Cluster
	members []*kvcluster.Member
	router  *client.Router
	svc     ratelimitv1.RateLimitServiceClient
	pki     *launch.PKI
	keys    []string
}

func runMemberScenario(t *testing.T, ctx context.Context, bin string, sc memberScenario) {
	r := &memberRun{t: t, ctx: ctx, sc: sc}
	r.start(bin)
	var idle []float64
	if sc.fault == "cpu" {
		idle = r.cpuOver(cpuWindow)
	}
	load := newMemberLoad(r)
	stopLoad := load.run(ctx)
	defer stopLoad()
	load.waitAnswered(t, int(sc.rate)*3)
	switch sc.fault {
	case "kill", "stop":
		r.crash(load)
	case "roll":
		r.roll(load)
	case "cpu":
		r.reportCPU(idle, r.cpuOver(cpuWindow))
	}
	stopLoad()
	r.checkProcesses()
}

// start starts etcd, an assigner, the members and the router.
func (r *memberRun) start(bin string) {
	t, dir := r.t, r.t.TempDir()
	var err error
	if r.pki, err = launch.NewPKI(filepath.Join(dir, "pki"), 0); err != nil {
		t.Fatal(err)
	}
	etcdTLS, err := r.pki.Issue("etcd", "members")
	if err != nil {
		t.Fatal(err)
	}
	etcd, err := embedetcd.Start(r.ctx, embedetcd.Options{Dir: filepath.Join(dir, "etcd"), Fast: true, TLS: etcdTLS, LogLevel: "fatal"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	args := []string{"--roles", "primary-secondary", "--exclusive", "--log-format", "json"}
	if r.sc.nodeTTL > 0 {
		args = append(args, "--node-ttl", r.sc.nodeTTL.String())
	}
	if r.sc.minReplicas > 0 {
		args = append(args, "--min-replicas", strconv.Itoa(r.sc.minReplicas))
	}
	if n := r.sc.slicesPerMember; n > 0 {
		args = append(args, "--param", fmt.Sprintf("initial_slices_per_node=%d", n), "--param", fmt.Sprintf("max_slices_per_node=%d", 2*n))
	}
	// The first map waits for every member: made for the first alone, the passes after it
	// would move most of it while the load starts.
	args = append(args, "--first-map-nodes", strconv.Itoa(r.sc.members), "--first-map-wait", "30s")
	r.cluster, err = kvcluster.New(kvcluster.Options{Bin: bin, Dir: dir, Etcd: []string{etcd.Endpoint()}, PKI: r.pki,
		DrainTimeout: 30 * time.Second, AssignerArgs: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.cluster.Stop(10 * time.Second); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	if _, err := r.cluster.StartAssigner(r.ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= r.sc.members; i++ {
		m, err := r.cluster.StartRateLimiter(r.ctx, fmt.Sprintf("m%d", i), "--log-format", "json")
		if err != nil {
			t.Fatal(err)
		}
		r.members = append(r.members, m)
	}
	r.startRouter()
	for i := range r.sc.keys {
		r.keys = append(r.keys, fmt.Sprintf("key-%d", i))
	}
}

// startRouter starts the test's router, with a router's certificate, and the ClientConn
// that routes through it, and waits until every key has a primary.
func (r *memberRun) startRouter() {
	t := r.t
	files, err := r.pki.Issue("router", "members-load")
	if err != nil {
		t.Fatal(err)
	}
	src, err := files.Load()
	if err != nil {
		t.Fatal(err)
	}
	r.router, err = client.NewRouter(client.RouterConfig{Assigners: r.cluster.Assigners(), Policy: client.LeastOutstanding,
		TLS: client.TLS{Cert: files.Cert, Key: files.Key, CA: files.CA}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.router.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	conn, err := grpc.NewClient("sliceplane:///ratelimit", append(client.GRPCDialOptions(r.router), src.DialOption("node"))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.svc = ratelimitv1.NewRateLimitServiceClient(conn)
	r.waitPrimaries()
}

// waitPrimaries waits until the router names a primary for every point of the key space.
func (r *memberRun) waitPrimaries() {
	err := launch.WaitFor(r.ctx, "every key has a primary", 50*time.Millisecond, func(context.Context) error {
		for i := range 256 {
			if _, err := r.router.Primary(fmt.Appendf(nil, "probe-%d", i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// primaries returns, by member ID, the keys the router names it the primary of.
func (r *memberRun) primaries() map[string][]string {
	out := map[string][]string{}
	for _, k := range r.keys {
		if rep, err := r.router.Primary([]byte(k)); err == nil {
			out[rep.ID] = append(out[rep.ID], k)
		}
	}
	return out
}

// victim returns the running member that is the primary of the most keys, and those keys.
func (r *memberRun) victim() (*kvcluster.Member, []string) {
	byMember := r.primaries()
	var best *kvcluster.Member
	for _, m := range r.members {
		if best == nil || len(byMember[m.ID]) > len(byMember[best.ID]) {
			best = m
		}
	}
	return best, byMember[best.ID]
}

// checkProcesses fails if a member or the assigner exited unasked.
func (r *memberRun) checkProcesses() {
	if err := r.cluster.Exited(); err != nil {
		r.t.Errorf("a process exited: %v", err)
	}
}

// signal sends sig to m's process.
func signal(t *testing.T, m *kvcluster.Member, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(m.Proc().Pid(), sig); err != nil {
		t.Fatalf("signal %s to %s: %v", sig, m.ID, err)
	}
}
