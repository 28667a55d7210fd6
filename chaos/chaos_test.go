// Package chaos_test is Sliceplane's chaos suite: it builds the real binaries, runs a
// three-member etcd cluster, two assigners, two distributors and four nodes of the example
// key-value store with fault proxies on the nodes' links and the assigners' etcd links,
// writes and reads throughout, and breaks the system on a seeded schedule: kill -9 of each
// kind of process, SIGSTOP of the leader beyond its lease, a wiped node disk, link latency,
// cuts and stalls, the leader cut off etcd, and the etcd leader killed. After each fault the
// nodes must hold exactly what they must (nothing missing, leaked or stale), every process
// must be alive, and no log may hold a panic or a race report.
//
// Environment: CHAOS_SEED (schedule and targets), CHAOS_FAULTS (comma-separated names, or
// "all"; default a quick few), CHAOS_ROUNDS, CHAOS_RACE=1 (race-built binaries),
// CHAOS_ASSIGNER_STALENESS (assigner faults: changes keep reaching nodes while the
// assigners fail over, so a node's staleness stays within it; default 1s),
// CHAOS_MAX_STALENESS (link faults; default 10s), CHAOS_PATIENCE (each wait; default 90s),
// CHAOS_STRICT_CLOCK=1 (fail when a node's clock goes back; by default only counted),
// CHAOS_SESSION_TTL (the assigners' leader lease; default 5s), CHAOS_TARGETS (the targets
// kept beside the default one, each with its own distributor, two nodes, writer and reader,
// whose items are checked after every fault as the default target's are; an assigner fault
// strikes the leader of a target the seed picks; default "second", "none" for none). make
// chaos runs every fault, once with plain and once with race builds.
//
// TestChaosPostgres runs the suite with the items in PostgreSQL (CHAOS_PG_FAULTS);
// TestChaosCounter runs the example counter under faults of its primaries, assigners and etcd,
// and checks that no range ever has two primaries and that, after each fault, every key had
// a primary again within the fault's bound (a lease and a second for a primary's fault)
// (CHAOS_COUNTER_FAULTS, CHAOS_COUNTER_EXCLUSIVE=0 for the cluster without leases and
// fence, CHAOS_COUNTER_LEASE for the lease, default 2s).
package chaos_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcheck"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/loadgen"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/source"
)

// quickFaults run when CHAOS_FAULTS is unset: the short run inside make test.
const quickFaults = "kill-assigner,kill-distributor,kill-node,link-latency"

// The faults of the run on PostgreSQL (TestChaosPostgres, CHAOS_PG_FAULTS): quickPGFaults
// in make test, allPGFaults in make chaos, a name*N running N times a round.
const (
	quickPGFaults = "pg-restart,pg-outage"
	allPGFaults   = "pg-restart*10,pg-outage*3"
)

// The data sources a run keeps its items in.
const (
	sourceEtcd     = "etcd"
	sourcePostgres = "postgres"
)

type config struct {
	// source is where the items are: sourceEtcd (the prefix of the cluster's etcd) or
	// sourcePostgres (a throwaway server, reached through a fault proxy).
	source string
	seed   uint64
	faults []fault
	rounds int
	race   bool
	// assignerStale bounds a node's staleness during an assigner fault: distributors route
	// changes by the last map they know while no quantum comes.
	assignerStale time.Duration
	maxStale      time.Duration
	patience      time.Duration
	// sessionTTL is the assigners' leader lease: long enough by default (the binary's
	// default, 5 s) to outlast an etcd election (1.3–2 s here), which a leader must ride out.
	sessionTTL time.Duration
	fillItems  int
	// strictClock fails a fault after which a node's clock went back (CHAOS_STRICT_CLOCK=1);
	// otherwise the table only counts it.
	strictClock bool
	// tenants are the targets the run keeps beside the default one (CHAOS_TARGETS).
	tenants []string
}

func envDuration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return d, nil
}

// loadConfig reads the run's settings from the environment, for a run on src: its faults
// from CHAOS_FAULTS (etcd) or CHAOS_PG_FAULTS (postgres).
func loadConfig(src string) (config, error) {
	cfg, err := loadBase()
	if err != nil {
		return cfg, err
	}
	cfg.source = src
	if cfg.tenants, err = tenantsOf(os.Getenv("CHAOS_TARGETS")); err != nil {
		return cfg, err
	}
	cfg.faults, err = faultsOf(src)
	return cfg, err
}

// loadBase reads the settings every run of the suite shares (TestChaosCounter's too): the
// seed, the rounds, the race build, the leases and the patience.
func loadBase() (config, error) {
	cfg := config{seed: 1, rounds: 1, fillItems: 2000}
	var err error
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		if cfg.seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			return cfg, fmt.Errorf("CHAOS_SEED: %w", err)
		}
	}
	if v := os.Getenv("CHAOS_ROUNDS"); v != "" {
		if cfg.rounds, err = strconv.Atoi(v); err != nil || cfg.rounds < 1 {
			return cfg, fmt.Errorf("CHAOS_ROUNDS: want a positive number, got %q", v)
		}
	}
	cfg.race = os.Getenv("CHAOS_RACE") == "1"
	cfg.strictClock = os.Getenv("CHAOS_STRICT_CLOCK") == "1"
	if cfg.assignerStale, err = envDuration("CHAOS_ASSIGNER_STALENESS", time.Second); err != nil {
		return cfg, err
	}
	if cfg.maxStale, err = envDuration("CHAOS_MAX_STALENESS", 10*time.Second); err != nil {
		return cfg, err
	}
	if cfg.sessionTTL, err = envDuration("CHAOS_SESSION_TTL", 5*time.Second); err != nil {
		return cfg, err
	}
	if cfg.sessionTTL < time.Second || cfg.sessionTTL%time.Second != 0 {
		return cfg, fmt.Errorf("CHAOS_SESSION_TTL: want whole seconds, got %s", cfg.sessionTTL)
	}
	cfg.patience, err = envDuration("CHAOS_PATIENCE", 90*time.Second)
	return cfg, err
}

// faultsOf returns the faults the environment asks of a run on src.
func faultsOf(src string) ([]fault, error) {
	env, quick, all, list := "CHAOS_FAULTS", quickFaults, "", faults
	if src == sourcePostgres {
		env, quick, all, list = "CHAOS_PG_FAULTS", quickPGFaults, allPGFaults, pgFaults
	}
	return selectFaults(env, quick, all, list, func(f fault) string { return f.name })
}

// selectFaults returns the faults of list that the environment variable env names: names,
// "all" (all, or every fault of list when all is empty), or quick when unset; "name*N" runs
// a fault N times a round. Generic, for the counter run's faults of another type.
func selectFaults[F any](env, quick, all string, list []F, nameOf func(F) string) ([]F, error) {
	var every []string
	for _, f := range list {
		every = append(every, nameOf(f))
	}
	names := os.Getenv(env)
	switch {
	case names == "":
		names = quick
	case names == "all" && all != "":
		names = all
	case names == "all":
		names = strings.Join(every, ",")
	}
	var out []F
	for name := range strings.SplitSeq(names, ",") {
		name, times := strings.TrimSpace(name), 1
		if n, t, ok := strings.Cut(name, "*"); ok {
			var err error
			if times, err = strconv.Atoi(t); err != nil || times < 1 {
				return nil, fmt.Errorf("%s: %q: want name*N, N a positive number", env, name)
			}
			name = n
		}
		i := slices.IndexFunc(list, func(f F) bool { return nameOf(f) == name })
		if i < 0 {
			return nil, fmt.Errorf("%s: no fault %q (known: %s)", env, name, strings.Join(every, ","))
		}
		for range times {
			out = append(out, list[i])
		}
	}
	return out, nil
}

// schedule is the faults of every round, each round shuffled by the seed.
func (cfg config) schedule(rng *rand.Rand) []fault { return shuffled(rng, cfg.rounds, cfg.faults) }

// shuffled returns rounds copies of faults, each shuffled by rng.
func shuffled[F any](rng *rand.Rand, rounds int, faults []F) []F {
	var out []F
	for range rounds {
		round := slices.Clone(faults)
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		out = append(out, round...)
	}
	return out
}

// run is one chaos run.
type run struct {
	t   *testing.T
	ctx context.Context
	cfg config
	rng *rand.Rand
	c   *cluster
	// src is the source as the checker reads it, and w the application's writer of it.
	src    source.Writer
	w      itemWriter
	pg     *postgresSource // the run on PostgreSQL's server and its proxy; nil on etcd
	probes *probes
	// tenants are the run's other targets, each with its own nodes, writer and probes.
	tenants []*tenant
	rows    []row
}

// itemWriter writes items as the application does: into etcd (client/writer) or into a
// PostgreSQL table (client/pgwriter). Each call returns a clock at or after its change's.
type itemWriter interface {
	PutMany(ctx context.Context, items []client.Item) (uint64, error)
	Delete(ctx context.Context, key []byte) (uint64, error)
}

// row is the report line of one fault.
type row struct {
	fault, target      string
	takeover           time.Duration
	win                window
	termBefore, termAt uint64
	converge           time.Duration
	// recovered is the time from the source's return to every node fresh again and holding a
	// write made after it (source faults only).
	recovered time.Duration
	failures  []string
	// tenants are what the other targets' probes saw, in the order of run.tenants.
	tenants []window
}

func TestChaos(t *testing.T) { runChaos(t, sourceEtcd) }

// runChaos runs the faults the environment asks for on a cluster whose items are in src.
func runChaos(t *testing.T, src string) {
	skipUnlessBinaries(t)
	cfg, err := loadConfig(src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := runContext(t)
	defer cancel()
	r := &run{t: t, ctx: ctx, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.seed, cfg.seed))}
	var names []string
	for _, f := range cfg.faults {
		names = append(names, f.name)
	}
	t.Logf("source=%s CHAOS_SEED=%d faults=%s CHAOS_ROUNDS=%d CHAOS_RACE=%v CHAOS_SESSION_TTL=%s CHAOS_TARGETS=%s",
		cfg.source, cfg.seed, strings.Join(names, ","), cfg.rounds, cfg.race, cfg.sessionTTL, strings.Join(cfg.tenants, ","))
	r.setUp()
	var wg sync.WaitGroup
	pctx, stopProbes := context.WithCancel(ctx)
	defer wg.Wait()
	defer stopProbes()
	r.probes.run(pctx, &wg)
	for _, tn := range r.tenants {
		tn.probes.run(pctx, &wg)
	}
	for i, f := range cfg.schedule(r.rng) {
		r.inject(i+1, f)
	}
	r.windows()
	stopProbes()
	wg.Wait()
	if _, err := r.check("the end"); err != nil {
		t.Error(err)
	}
	t.Logf("chaos report (source %s, CHAOS_SEED=%d, race=%v):\n%s", cfg.source, cfg.seed, cfg.race, r.table())
}

// skipUnlessBinaries skips a test of the suite where it cannot build and run the binaries.
func skipUnlessBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries; skipped in -short mode")
	}
	if raceEnabled {
		t.Skip("builds its own binaries (CHAOS_RACE=1 builds them with -race); run it without -race, as make test and make chaos do")
	}
}

// runContext returns a run's context: it ends 30 s before the test's deadline, so that a
// run that hangs still reports and cleans up.
func runContext(t *testing.T) (context.Context, context.CancelFunc) {
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Minute)
	}
	return context.WithDeadline(context.Background(), deadline.Add(-30*time.Second))
}

// workspace makes a run's directory (kept, with the logs, when the test fails) and builds
// pkgs (with -race when race) and etcd into its bin/.
func workspace(ctx context.Context, t *testing.T, race bool, pkgs ...string) (dir, bin string) {
	dir, err := os.MkdirTemp("", "sliceplane-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs and data kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	bin = filepath.Join(dir, "bin")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := launch.Build(ctx, root, bin, race, pkgs...); err != nil {
		t.Fatal(err)
	}
	// etcd is built from this module's own dependency, never with -race: it is not ours.
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(bin, "etcd"), "go.etcd.io/etcd/server/v3")
	build.Dir = root
	if out, err := launch.CombinedOutput(build); err != nil {
		t.Fatalf("building etcd: %v\n%s", err, out)
	}
	t.Logf("built the binaries in %s", time.Since(start).Round(time.Millisecond))
	return dir, bin
}

// setUp builds the binaries, starts the cluster and the router, fills the source, waits for
// every node to hold slices and freezes the map: each convergence check compares the nodes
// with one map, and failover and recovery of the data path need no balancing.
func (r *run) setUp() {
	t := r.t
	dir, bin := workspace(r.ctx, t, r.cfg.race, "./cmd/assigner", "./cmd/distributor", "./examples/kvstore/cmd/kvnode")
	var err error
	if r.c, err = newCluster(dir, bin, r.cfg.sessionTTL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.c.close)
	if r.cfg.source == sourcePostgres {
		r.startPostgres(dir) // before the processes that read it
	}
	r.declareTenants(dir)
	r.startAll()
	if r.pg == nil {
		r.w = writer.New(r.c.etcdCli, writer.DefaultPrefix)
		r.src = source.NewEtcd(r.c.etcdCli, writer.DefaultPrefix)
	}
	r.fill(r.w)
	r.probes = r.newProbes("", r.w, r.c.nodes)
	r.spread("", r.probes, r.c.nodes)
	r.setUpTenants()
	if _, err := r.check("the fill"); err != nil {
		t.Fatal(err)
	}
}

func (r *run) startAll() {
	t := r.t
	if err := r.c.startEtcd(r.ctx, 3); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a1", "a2"} {
		if err := r.c.startAssigner(r.ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"d1", "d2"} {
		if err := r.c.startDistributor(r.ctx, "", id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		if err := r.c.startNode(r.ctx, "", id); err != nil {
			t.Fatal(err)
		}
	}
	r.startTenants()
}

// fill writes the keys of the fill with w.
func (r *run) fill(w itemWriter) {
	var items []client.Item
	for i := range r.cfg.fillItems {
		items = append(items, client.Item{Key: loadgen.Key(i), Value: fmt.Appendf(nil, "v%d", i), HasValue: true})
		if len(items) == 100 || i == r.cfg.fillItems-1 {
			if _, err := w.PutMany(r.ctx, items); err != nil {
				r.t.Fatalf("filling: %v", err)
			}
			items = items[:0]
		}
	}
}

// newProbes starts the router of target tgt's reader ("" the default target), owned by the
// test's cleanup, and returns the probes that write with w and sample nodes.
func (r *run) newProbes(tgt string, w itemWriter, nodes []*member) *probes {
	// A router's identity: it reads the map and lists the nodes for their addresses.
	rt, err := r.c.pki.IssueOf(certs.Request{Target: tgt, Kind: "router", Name: "chaos"})
	if err != nil {
		r.t.Fatal(err)
	}
	router, err := client.NewRouter(client.RouterConfig{Assigners: r.c.assignerAddrs(), Target: tgt,
		TLS: client.TLS{Cert: rt.Cert, Key: rt.Key, CA: rt.CA}})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		router.Run(ctx) //nolint:errcheck // it returns nil when ctx ends
	}()
	r.t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer wcancel()
	if err := router.WaitReady(wctx); err != nil {
		r.t.Fatal(err)
	}
	logf := r.t.Logf
	if tgt != "" {
		logf = func(format string, args ...any) { r.t.Logf(tgt+": "+format, args...) }
	}
	return &probes{w: w, router: router, pool: kvclient.NewPool(r.c.http), nodes: nodes, logf: logf,
		initial: r.cfg.fillItems, next: r.cfg.fillItems}
}

// spread waits until every node of target tgt holds slices, making load with reads through
// p, and then freezes the target's map.
func (r *run) spread(tgt string, p *probes, nodes []*member) {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	err := launch.WaitFor(ctx, "every node to hold slices", 100*time.Millisecond, func(ctx context.Context) error {
		for i := range 300 {
			p.pool.Read(ctx, p.router, loadgen.Key(i)) //nolint:errcheck // only the load counts here
		}
		for _, n := range nodes {
			st, err := kvclient.New(n.addr, r.c.http).State(ctx)
			if err != nil {
				return err
			}
			if len(st.Slices) == 0 {
				return fmt.Errorf("%s holds no slice", n.id)
			}
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	conn, err := dial.TargetLeader(tgt, r.c.assignerAddrs(), r.c.tls.DialOption("assigner"))
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pb.NewAdminServiceClient(conn).Freeze(ctx, &pb.FreezeRequest{Reason: "chaos"}, grpc.WaitForReady(true)); err != nil {
		r.t.Fatal(err)
	}
}

// check pauses the writer and waits until the nodes hold exactly what they must, then checks
// that every process runs and no log holds a panic or a race report.
func (r *run) check(after string) (time.Duration, error) {
	start := time.Now()
	if err := r.converged(after, "", r.probes, r.src, r.c.nodes); err != nil {
		return time.Since(start), err
	}
	took := time.Since(start)
	for _, tn := range r.tenants {
		if err := r.converged(after, tn.name, tn.probes, tn.src, tn.nodes()); err != nil {
			return took, err
		}
	}
	var dead []string
	for _, m := range r.c.all() {
		if !m.alive() {
			dead = append(dead, m.name())
		}
	}
	if len(dead) > 0 {
		return took, fmt.Errorf("after %s: not running: %s (%v)", after, strings.Join(dead, ", "), r.c.exited())
	}
	if err := r.c.scanLogs(); err != nil {
		return took, fmt.Errorf("after %s: %w", after, err)
	}
	return took, nil
}

// converged pauses p's writer and waits until the nodes of target tgt ("" the default
// target) hold exactly what src holds by the target's map.
func (r *run) converged(after, tgt string, p *probes, src source.Writer, members []*member) error {
	resume := p.pause()
	defer resume()
	start := time.Now()
	conn, err := dial.TargetLeader(tgt, r.c.assignerAddrs(), r.c.tls.DialOption("assigner"))
	if err != nil {
		return err
	}
	defer conn.Close()
	var nodes []*kvclient.Node
	for _, n := range members {
		nodes = append(nodes, kvclient.New(n.addr, r.c.http))
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	rep, err := (&kvcheck.Checker{Source: src, Assigner: conn, Nodes: nodes}).Wait(ctx)
	if tgt != "" {
		after += " (target " + tgt + ")"
	}
	if err != nil {
		return fmt.Errorf("after %s: %w", after, err)
	}
	r.t.Logf("after %s: %s (in %s)", after, rep, time.Since(start).Round(time.Millisecond))
	return nil
}

// term returns the leading assigner's term, 0 if none answers.
func (r *run) term() uint64 {
	_, term, err := r.leader("", nil)
	if err != nil {
		return 0
	}
	return term
}

// inject runs one fault, checks the cluster after it, and records and asserts its figures.
func (r *run) inject(i int, f fault) {
	r.t.Logf("=== fault %d: %s", i, f.name)
	r.windows()
	row := row{fault: f.name, termBefore: r.term()}
	o, err := f.run(r)
	row.target, row.takeover, row.recovered = o.target, o.takeover, o.recovered
	if err != nil {
		row.failures = append(row.failures, fmt.Sprintf("the fault: %v", err))
	}
	row.converge, err = r.check(f.name)
	if err != nil {
		row.failures = append(row.failures, err.Error())
	}
	row.win, row.tenants = r.windows()
	row.termAt = r.term()
	row.failures = append(row.failures, r.assess(f, row)...)
	for _, msg := range row.failures {
		r.t.Errorf("fault %d (%s): %s", i, f.name, msg)
	}
	r.rows = append(r.rows, row)
	r.t.Logf("fault %d: %s", i, row.line())
}

// assess returns the bounds a fault's figures break, in every target.
func (r *run) assess(f fault, row row) []string {
	out := r.assessWindow(f, row.win, row.takeover)
	for i, w := range row.tenants {
		for _, msg := range r.assessWindow(f, w, row.takeover) {
			out = append(out, "target "+r.tenants[i].name+": "+msg)
		}
	}
	if f.class == "etcd" || f.class == "source" {
		// Leadership is etcd's: an etcd election or the source away must not cost a term.
		if row.termAt != row.termBefore {
			out = append(out, fmt.Sprintf("the assigner's term went from %d to %d", row.termBefore, row.termAt))
		}
	}
	return out
}

// assessWindow returns the bounds one target's probes broke during fault f.
func (r *run) assessWindow(f fault, win window, takeover time.Duration) []string {
	var out []string
	if win.readMisses > 0 {
		// The reader reads keys of the fill, which always exist: a "not found" is data
		// a node lost or served before it had it (I7).
		out = append(out, fmt.Sprintf("%d reads of existing keys were answered \"not found\"", win.readMisses))
	}
	if r.cfg.strictClock && win.regressions > 0 {
		out = append(out, fmt.Sprintf("a node's clock went back %d times", win.regressions))
	}
	switch f.class {
	case "assigner":
		if win.staleness > r.cfg.assignerStale {
			out = append(out, fmt.Sprintf("node %s was %s stale during a takeover of %s, over %s",
				win.stalest, win.staleness.Round(time.Millisecond), takeover.Round(time.Millisecond), r.cfg.assignerStale))
		}
	case "link":
		if win.staleness > r.cfg.maxStale {
			out = append(out, fmt.Sprintf("node %s was %s stale, over %s", win.stalest, win.staleness.Round(time.Millisecond), r.cfg.maxStale))
		}
	}
	return out
}

func (row row) line() string {
	takeover, recovered := "-", "-"
	if row.takeover > 0 {
		takeover = row.takeover.Round(10 * time.Millisecond).String()
	}
	if row.recovered > 0 {
		recovered = row.recovered.Round(10 * time.Millisecond).String()
	}
	verdict := "ok"
	if len(row.failures) > 0 {
		verdict = "FAIL"
	}
	others := "-"
	if len(row.tenants) > 0 {
		var parts []string
		for _, w := range row.tenants {
			parts = append(parts, fmt.Sprintf("%s/%d/%d/%d", w.staleness.Round(10*time.Millisecond), w.readFails, w.readMisses, w.writeFails))
		}
		others = strings.Join(parts, ", ")
	}
	return fmt.Sprintf("| %s | %s | %s | %s (%s) | %d | %d/%d | %d/%d | %d/%d | %s | %d→%d | %s | %s | %s |", row.fault, row.target, takeover,
		row.win.staleness.Round(10*time.Millisecond), row.win.stalest, row.win.regressions, row.win.readFails, row.win.reads,
		row.win.readMisses, row.win.reads, row.win.writeFails, row.win.writes, others, row.termBefore, row.termAt, recovered,
		row.converge.Round(10*time.Millisecond), verdict)
}

func (r *run) table() string {
	var b strings.Builder
	b.WriteString("| fault | target | takeover | max staleness (node) | clock went back | reads failed | reads missed | writes failed | other targets: staleness/reads failed/missed/writes failed | term | recovered in | converged in | verdict |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	recovered := map[string][]time.Duration{}
	terms := map[uint64]bool{}
	for _, row := range r.rows {
		b.WriteString(row.line() + "\n")
		if row.recovered > 0 {
			recovered[row.fault] = append(recovered[row.fault], row.recovered)
		}
		terms[row.termBefore], terms[row.termAt] = true, true
	}
	for _, f := range slices.Sorted(maps.Keys(recovered)) {
		d := recovered[f]
		slices.Sort(d)
		fmt.Fprintf(&b, "%s: from the source's return to every node fresh with the writes after it: p50 %s, p99 %s, max %s (%d)\n",
			f, quantile(d, 0.5), quantile(d, 0.99), d[len(d)-1].Round(time.Millisecond), len(d))
	}
	delete(terms, 0)
	fmt.Fprintf(&b, "assigner terms seen: %d\n", len(terms))
	return b.String()
}

// quantile returns the q-quantile of sorted d, the nearest rank.
func quantile(d []time.Duration, q float64) time.Duration {
	i := min(len(d)-1, int(math.Ceil(q*float64(len(d))))-1)
	return d[max(i, 0)].Round(time.Millisecond)
}
