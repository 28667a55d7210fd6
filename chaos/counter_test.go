package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/counter/countercheck"
	"github.com/sliceplane/sliceplane/examples/counter/counterload"
	"github.com/sliceplane/sliceplane/examples/counter/countermember"
	"github.com/sliceplane/sliceplane/examples/counter/counterproxy"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
)

// TestChaosCounter runs the example counter (examples/counter) under the suite's faults and
// checks that a range never has two primaries (I11), and that every key has a primary again
// within the fault's bound (counterFault.bound): three etcd members, two assigners with
// primary and secondary roles and leases on primary roles (--exclusive), three countermembers
// keeping their counts in PostgreSQL, each reaching the assigners through fault proxies of its
// own, and increments through the Go router all along. After each fault every point must have
// a primary again and every key take increments. At the end the counts must be a counter's
// (countercheck: no count answered twice, none skipped, none lost), no two members' logs may
// say they held a point as primary at one instant (countercheck.Windows, Overlaps), and no log
// may hold a panic or a race report.
//
// Environment, besides the suite's (CHAOS_SEED, CHAOS_ROUNDS, CHAOS_RACE, CHAOS_SESSION_TTL,
// CHAOS_PATIENCE): CHAOS_COUNTER_FAULTS (comma-separated names or "all"; default a quick
// two), CHAOS_COUNTER_EXCLUSIVE=0 (the assigners without --exclusive and the members without
// the fence: the run reports what breaks and fails only on panics, races and dead processes).
func TestChaosCounter(t *testing.T) {
	skipUnlessBinaries(t)
	if err := pgcluster.Installed(); err != nil {
		t.Skipf("the counter keeps its counts in PostgreSQL: %v", err)
	}
	cfg, err := loadCounterConfig()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := runContext(t)
	defer cancel()
	r := &counterRun{run: &run{t: t, ctx: ctx, cfg: cfg.config, rng: rand.New(rand.NewPCG(cfg.seed, cfg.seed))}, ccfg: cfg,
		deaths: map[string][]time.Time{}}
	var names []string
	for _, f := range cfg.kinds {
		names = append(names, f.name)
	}
	t.Logf("counter: CHAOS_SEED=%d faults=%s CHAOS_ROUNDS=%d CHAOS_RACE=%v exclusive=%v node-ttl=%s CHAOS_SESSION_TTL=%s",
		cfg.seed, strings.Join(names, ","), cfg.rounds, cfg.race, cfg.exclusive, cfg.lease, cfg.sessionTTL)
	start := time.Now()
	r.setUp()
	t.Logf("counter: set up in %s", time.Since(start).Round(time.Millisecond))
	for i, f := range shuffled(r.rng, cfg.rounds, cfg.kinds) {
		if i > 0 {
			// Each fault comes once the assigner's quarantine guard (--quarantine-window,
			// three leases by default) has forgotten the last: two members that lapse within
			// it, each soon after acquiring a range, are how a key of death looks, and the
			// guard rightly takes the range off every member. These faults are independent.
			time.Sleep(3 * cfg.lease)
		}
		r.inject(i+1, f)
	}
	r.finish()
}

// The counter run's shape. The lease (--node-ttl, CHAOS_COUNTER_LEASE) is short by default
// so that a fault of a primary resolves in seconds (shorter than an assigner failover, it
// lapses in one: a longer one rides it out); the handoff timeout bounds a planned move
// whose old primary does not demote.
const (
	counterNodeTTL   = 2 * time.Second
	counterHandoff   = 5 * time.Second
	counterDrain     = 15 * time.Second // a member's drain on SIGTERM (roll)
	counterKeys      = 100
	counterRate      = 300 // increments a second
	counterMembers   = 3
	quickCounterRuns = "stop-primary,kill-primary"
)

// counterConfig is the counter run's settings: the suite's, its faults, and whether the
// cluster is exclusive.
type counterConfig struct {
	config
	kinds     []counterFault
	exclusive bool
	lease     time.Duration // the assigners' --node-ttl
}

func loadCounterConfig() (counterConfig, error) {
	base, err := loadBase()
	if err != nil {
		return counterConfig{}, err
	}
	cfg := counterConfig{config: base, exclusive: os.Getenv("CHAOS_COUNTER_EXCLUSIVE") != "0"}
	if cfg.lease, err = envDuration("CHAOS_COUNTER_LEASE", counterNodeTTL); err != nil {
		return counterConfig{}, err
	}
	cfg.kinds, err = selectFaults("CHAOS_COUNTER_FAULTS", quickCounterRuns, "", counterFaults,
		func(f counterFault) string { return f.name })
	return cfg, err
}

// counterRun is one run of TestChaosCounter. It embeds the suite's run, whose assigner and
// etcd faults it reuses (they need its cluster, context, seed and leases only).
type counterRun struct {
	*run
	ccfg  counterConfig
	dsn   string
	admin pb.AdminServiceClient
	// router is the proxy's: it says which member is the primary of each key now.
	router  *client.Router
	proxy   string // the proxy's URL
	keys    []string
	history *countercheck.History
	incrs   *incrLog
	load    *counterload.Load
	// stopLoad ends the load and waits for the increments in flight.
	stopLoad func()
	// deaths are the times each member's incarnations ended (kill -9, or a stop once it
	// drained), in order: a window of its log still open then ends there.
	deaths map[string][]time.Time
	rows   []counterRow
}

// setUp builds the binaries, starts PostgreSQL, etcd, the assigners, the members, the router
// and the proxy, and the load, and waits until every member is the primary of some keys and
// every key takes increments.
func (r *counterRun) setUp() {
	t := r.t
	dir, bin := workspace(r.ctx, t, r.cfg.race, "./cmd/assigner", "./examples/counter/cmd/countermember")
	// PostgreSQL first: the cleanups run in reverse, and the members stop before it does.
	pg, err := pgcluster.Start(r.ctx, filepath.Join(dir, "postgres"), pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() }) //nolint:errcheck // a throwaway server
	r.dsn = pg.DSN
	if r.c, err = newCluster(dir, bin, r.cfg.sessionTTL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.c.close)
	// Balancing at the counter demo's pace (1 s passes, 2 s load half-life): unlike the kv
	// run's, this map is not frozen, so planned handoffs of primaries go on through the faults.
	r.c.assignerArgs = []string{"--roles", "primary-secondary", "--node-ttl", r.ccfg.lease.String(),
		"--handoff-timeout", counterHandoff.String(), "--pass-interval", "1s", "--load-half-life", "2s"}
	if r.ccfg.exclusive {
		r.c.assignerArgs = append(r.c.assignerArgs, "--exclusive")
	}
	if err := r.c.startEtcd(r.ctx, 3); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a1", "a2"} {
		if err := r.c.startAssigner(r.ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for i := range counterMembers {
		if err := r.startCounter(fmt.Sprintf("c%d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	r.connectAdmin()
	r.startProxy()
	r.startLoad()
	if err := r.spread(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.recovered(time.Now()); err != nil {
		t.Fatal(err)
	}
}

// startCounter starts member id, which reaches each assigner through a proxy of its own
// ("member-<id>-<assigner>": cutting them all partitions it from the assigners while it
// still reaches PostgreSQL and serves increments), with JSON logs for the ownership check.
func (r *counterRun) startCounter(id string) error {
	c := r.c
	var assigners []string
	for _, a := range c.assigners {
		addr, err := c.proxy("member-"+id+"-"+a.id, a.addr)
		if err != nil {
			return err
		}
		assigners = append(assigners, addr)
	}
	addrs, err := launch.FreeAddrs(1)
	if err != nil {
		return err
	}
	tls, err := c.pki.Args("node", id) // a member's identity is a node's
	if err != nil {
		return err
	}
	m := &member{kind: "counter", id: id, addr: addrs[0], bin: filepath.Join(c.bin, "countermember")}
	m.args = append([]string{"--id", id, "--listen", m.addr, "--assigners", strings.Join(assigners, ","),
		"--pg-dsn", r.dsn, "--report-interval", "200ms", "--drain-timeout", counterDrain.String(), "--log-format", "json"}, tls...)
	if !r.ccfg.exclusive {
		m.args = append(m.args, "--plain-writes")
	}
	c.counters = append(c.counters, m)
	return c.start(r.ctx, m)
}

// connectAdmin dials the leading assigner as an admin, for the map's slices.
func (r *counterRun) connectAdmin() {
	conn, err := dial.Leader(r.c.assignerAddrs(), r.c.tls.DialOption("assigner"))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { conn.Close() })
	r.admin = pb.NewAdminServiceClient(conn)
}

// startProxy starts the router (a router's certificate; it dials the assigners directly)
// and the counter's proxy over it, in this process, on loopback.
func (r *counterRun) startProxy() {
	t := r.t
	files, err := r.c.pki.Issue("router", "chaos-counter")
	if err != nil {
		t.Fatal(err)
	}
	src, err := files.Load()
	if err != nil {
		t.Fatal(err)
	}
	r.router, err = client.NewRouter(client.RouterConfig{Assigners: r.c.assignerAddrs(), Policy: client.LeastOutstanding,
		TLS: client.TLS{Cert: files.Cert, Key: files.Key, CA: files.CA}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	routed := make(chan struct{})
	go func() { defer close(routed); r.router.Run(ctx) }() //nolint:errcheck // nil when ctx ends
	t.Cleanup(func() { cancel(); <-routed })
	wctx, wcancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer wcancel()
	if err := r.router.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Many connections to each member: increments to a stopped one hang, the others go on.
	base := kvclient.HTTPClient(src, 0).Transport.(*http.Transport)
	base.MaxIdleConnsPerHost = 256
	srv := &http.Server{Handler: counterproxy.New(r.router, base, "https"), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(lis) //nolint:errcheck // it returns when closed
	t.Cleanup(func() { srv.Close() })
	r.proxy = "http://" + lis.Addr().String()
}

// startLoad starts the increments: counterRate a second over counterKeys keys, each outcome
// recorded in the history and, with its time, in the run's incrLog. Many workers: the
// increments of a stopped primary's keys hang until it resumes (up to the load's timeout)
// while the other keys' go on, so that one fault's gap is its keys' alone.
func (r *counterRun) startLoad() {
	for i := range counterKeys {
		r.keys = append(r.keys, fmt.Sprintf("counter-%d", i))
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 1024
	r.incrs = &incrLog{base: base, last: map[string]time.Time{}}
	r.history = countercheck.NewHistory()
	r.load = counterload.New(counterload.Config{URL: r.proxy, Client: &http.Client{Transport: r.incrs}, Keys: counterKeys,
		Rate: counterRate, Workers: 1024}, r.history)
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.load.Run(ctx) }()
	var once sync.Once
	r.stopLoad = func() { once.Do(func() { cancel(); <-done }) }
	r.t.Cleanup(r.stopLoad)
}

// spread waits until every member is the primary of some keys: the faults pick a primary,
// and the balancer has spread the ranges from the member that registered first.
func (r *counterRun) spread() error {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	return launch.WaitFor(ctx, "every member to be the primary of some keys", 100*time.Millisecond, func(context.Context) error {
		byMember := r.primaries()
		for _, m := range r.c.counters {
			if len(byMember[m.id]) == 0 {
				return fmt.Errorf("%s is the primary of no key (%d members are of some)", m.id, len(byMember))
			}
		}
		return nil
	})
}

// primaries returns the keys of each member that the router says is their primary now.
func (r *counterRun) primaries() map[string][]string {
	out := map[string][]string{}
	for _, k := range r.keys {
		if rep, err := r.router.Primary([]byte(k)); err == nil {
			out[rep.ID] = append(out[rep.ID], k)
		}
	}
	return out
}

// everyPointHasPrimary returns an error naming a slice of the map without a primary.
func (r *counterRun) everyPointHasPrimary(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := r.admin.ListSlices(ctx, &pb.ListSlicesRequest{Limit: 1 << 20}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	if int(list.GetTotal()) != len(list.GetSlices()) || len(list.GetSlices()) == 0 {
		return fmt.Errorf("listed %d slices of %d", len(list.GetSlices()), list.GetTotal())
	}
	for _, s := range list.GetSlices() {
		if s.GetPrimary() == "" {
			return fmt.Errorf("slice %x… has no primary (replicas %v)", s.GetRange().GetStart(), s.GetReplicas())
		}
	}
	return nil
}

// recovered waits, from healed (the end of a fault), until every point of the map has a
// primary and every key took an increment answered after healed; it returns when.
func (r *counterRun) recovered(healed time.Time) (time.Time, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	var at time.Time
	err := launch.WaitFor(ctx, "every point to have a primary and every key to take an increment", 50*time.Millisecond,
		func(ctx context.Context) error {
			if err := r.everyPointHasPrimary(ctx); err != nil {
				return err
			}
			if k, ok := r.incrs.unackedSince(healed, r.keys); !ok {
				return fmt.Errorf("no increment of %s answered since %s", k, healed.Format("15:04:05.000"))
			}
			at = time.Now()
			return nil
		})
	return at, err
}

// holdsSlices waits until member id holds a slice of the map again.
func (r *counterRun) holdsSlices(id string) error {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	return launch.WaitFor(ctx, id+" to hold slices", 100*time.Millisecond, func(ctx context.Context) error {
		list, err := r.admin.ListSlices(ctx, &pb.ListSlicesRequest{Node: id, Limit: 1}, grpc.WaitForReady(true))
		if err != nil {
			return err
		}
		if list.GetTotal() == 0 {
			return fmt.Errorf("%s holds no slice", id)
		}
		return nil
	})
}

// takenOut waits until the map gives member id nothing: the assigner took it out.
func (r *counterRun) takenOut(id string) error {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	return launch.WaitFor(ctx, id+" to be taken out of the map", 100*time.Millisecond, func(ctx context.Context) error {
		list, err := r.admin.ListSlices(ctx, &pb.ListSlicesRequest{Node: id, Limit: 1}, grpc.WaitForReady(true))
		if status.Code(err) == codes.NotFound {
			return nil // the assigner no longer knows the member
		}
		if err != nil {
			return err
		}
		if n := list.GetTotal(); n > 0 {
			return fmt.Errorf("%s still holds %d slices", id, n)
		}
		return nil
	})
}

// finish stops the load and checks the run: the counts, the members' windows as primary,
// the logs, the processes; then it reports.
func (r *counterRun) finish() {
	t := r.t
	r.stopLoad()
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	pool, err := pgxpool.New(ctx, r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	stored, err := countermember.Stored(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	res := r.history.Check(stored)
	windows, err := r.ownership()
	if err != nil {
		t.Fatal(err)
	}
	overlaps := countercheck.Overlaps(windows)
	logGaps := r.checkBounds(windows)
	t.Logf("counter report (CHAOS_SEED=%d, exclusive=%v, race=%v):\n%s", r.cfg.seed, r.ccfg.exclusive, r.cfg.race,
		r.table(res, len(windows), len(overlaps), logGaps))
	r.verdict(res, overlaps)
	if err := r.c.scanLogs(); err != nil {
		t.Error(err)
	}
	if err := r.c.exited(); err != nil {
		t.Errorf("processes exited unasked: %v", err)
	}
}

// verdict reports what the checks found: failures in an exclusive cluster, where I11 must
// hold; only a report in one that is not, which shows what the leases and the fence prevent.
func (r *counterRun) verdict(res countercheck.Result, overlaps []string) {
	report := r.t.Errorf
	if !r.ccfg.exclusive {
		report = r.t.Logf
	}
	if !res.OK() {
		report("the counts are not a counter's: %s excused=%d lost=%d; the duplicates:\n%s", res, res.Excused, res.Lost,
			firstLines(r.history.Duplicates(), 40))
	}
	if len(overlaps) > 0 {
		report("%d times two members held a point as primary at once:\n%s", len(overlaps), firstLines(overlaps, 40))
	}
	if res.OK() && len(overlaps) == 0 {
		r.t.Logf("at most one primary: no duplicate, no skipped count, nothing lost, no overlap (exclusive=%v)", r.ccfg.exclusive)
	}
}

// firstLines joins the first n of lines, and says how many more there were.
func firstLines(lines []string, n int) string {
	if len(lines) <= n {
		return strings.Join(lines, "\n")
	}
	return strings.Join(lines[:n], "\n") + fmt.Sprintf("\n… and %d more", len(lines)-n)
}
