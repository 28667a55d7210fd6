// Package demo runs the example counter's demo (DEMO_APP=counter make demo): an embedded
// etcd, an assigner with primary and secondary roles, a throwaway PostgreSQL and three
// counter members (separate processes, every link mutual TLS), a proxy routing by key
// through the Go router, and a load of increments; optionally a rolling restart of every
// member. It ends with the counter check (countercheck).
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/counter/countercheck"
	"github.com/sliceplane/sliceplane/examples/counter/counterload"
	"github.com/sliceplane/sliceplane/examples/counter/countermember"
	"github.com/sliceplane/sliceplane/examples/counter/counterproxy"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/target/registry"
)

// Config shapes the demo.
type Config struct {
	// Bin holds the binaries: assigner, slicectl, countermember. Dir, the demo's data and logs.
	Bin, Dir string
	// Duration of the load; 0 runs until Stop is closed.
	Duration time.Duration
	Stop     <-chan struct{}
	// Members, Keys and Rate (increments per second) shape the load; Roll restarts every
	// member in turn, a quarter of the way in (or after 5 s without a Duration).
	Members, Keys int
	Rate          float64
	Roll          bool
	// WriteDelay is added to every increment's write (a slower database).
	WriteDelay time.Duration
	// Inclusive runs the cluster without leases (no --exclusive) and the members with plain
	// writes (no fence): what a stale primary does without them. Pause stops a member for
	// twice its lease (3 s) a quarter of the way in, then lets it go on.
	Inclusive, Pause bool
	// Plane, when set, is a control plane started elsewhere (the two-target demo), which the
	// members join: the demo then starts no etcd and no assigner. Its assigners must carry
	// PlaneArgs, and Target's config TargetConfig.
	Plane *kvcluster.Plane
	// Target is the target the members, the proxy's router and the demo's calls belong to;
	// "" for the default target.
	Target string
	Out    io.Writer
	Log    *slog.Logger
}

// Summary is the demo's outcome.
type Summary struct {
	Imbalance float64
	Check     countercheck.Result
	// paused is Config.Pause, which excuses failed increments.
	paused bool
}

func (s Summary) String() string { return fmt.Sprintf("final imbalance=%.2f %s", s.Imbalance, s.Check) }

// Err returns ErrCheck when the counts are not a counter's or an increment failed.
func (s Summary) Err() error {
	// A paused member's increments in flight get no answer: failed counts them then.
	if !s.Check.OK() || s.Check.Failed > 0 && !s.paused {
		return fmt.Errorf("%w (excused=%d lost=%d)", ErrCheck, s.Check.Excused, s.Check.Lost)
	}
	return nil
}

// drain bounds a member's drain on SIGTERM.
const drain = 20 * time.Second

// PlaneArgs are the assigner flags a control plane needs to serve the counter, beside its
// target's config: a handoff waits as long as a drain.
func PlaneArgs() []string { return []string{"--handoff-timeout", drain.String()} }

// TargetConfig is the counter's config as a target: primaries and secondaries, exclusive
// primaries (unless Inclusive) and, to Pause a member past it, a short lease. A control plane
// of the counter's own takes the same as the default target's flags (flagsOf).
func TargetConfig(cfg Config) registry.Config {
	tc := registry.Config{Roles: assignment.PrimarySecondary.Name, Exclusive: new(!cfg.Inclusive)}
	if cfg.Pause {
		tc.NodeTTL = pauseTTL.String()
	}
	return tc
}

// flagsOf returns tc as the assigner's flags, the default target's config.
func flagsOf(tc registry.Config) []string {
	args := []string{"--roles", tc.Roles}
	if *tc.Exclusive {
		args = append(args, "--exclusive")
	}
	if tc.NodeTTL != "" {
		args = append(args, "--node-ttl", tc.NodeTTL)
	}
	return args
}

type demo struct {
	cfg     Config
	pki     *launch.PKI
	plane   *kvcluster.Plane
	stopAll []func()
	dsn     string
	cluster *kvcluster.Cluster
	// assigners are the plane's; the first one's metrics address serves the web view too.
	assigners []*kvcluster.Member
	admin     pb.AdminServiceClient
	router    *client.Router
	proxy     string // the proxy's URL
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.cfg.Out, format+"\n", args...) }

// Run runs the demo until its Duration passes or Stop is closed, then checks the counts; it
// stops every process on the way out. The summary is valid when err is nil.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	d, err := Start(ctx, cfg)
	if err != nil {
		return Summary{}, err
	}
	defer d.Stop()
	return d.Run(ctx)
}

// Started is a demo whose processes serve: a launcher that runs several demos side by side
// starts them one after the other, so that their intros do not mix, and then runs them.
type Started struct{ d *demo }

// Start starts the demo's processes and says where they run; on error it stops them.
func Start(ctx context.Context, cfg Config) (*Started, error) {
	cfg.Members, cfg.Keys, cfg.Rate = orDefault(cfg.Members, 3), orDefault(cfg.Keys, 100), max(cfg.Rate, 1)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if target.Name(cfg.Target) == target.Default {
		cfg.Target = "" // a default target's identities name none, as before targets
	}
	d := &demo{cfg: cfg}
	if err := d.start(ctx); err != nil {
		d.stop()
		return nil, err
	}
	return &Started{d: d}, nil
}

// Run runs the load until Config.Duration passes or Config.Stop is closed, then checks the
// counts, as Run does; the processes go on until Stop.
func (s *Started) Run(ctx context.Context) (Summary, error) { return s.d.run(ctx) }

// Stop stops every process Start started.
func (s *Started) Stop() { s.d.stop() }

// stop stops everything start started, in reverse order.
func (d *demo) stop() {
	for i := len(d.stopAll) - 1; i >= 0; i-- {
		d.stopAll[i]()
	}
}

func orDefault(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// start starts PostgreSQL, the control plane (unless Config.Plane gives one), the members,
// the router and the proxy.
func (d *demo) start(ctx context.Context) error {
	pg, err := pgcluster.Start(ctx, filepath.Join(d.cfg.Dir, "postgres"), pgcluster.Options{})
	if err != nil {
		return fmt.Errorf("demo: the counter keeps its counts in PostgreSQL: %w", err)
	}
	d.stopAll = append(d.stopAll, func() { pg.Stop() }) //nolint:errcheck // throwaway
	d.dsn = pg.DSN
	if err := d.startPlane(ctx); err != nil {
		return err
	}
	memberArgs := []string{"--report-interval", "500ms", "--write-delay", d.cfg.WriteDelay.String(), "--log-format", "json"}
	if d.cfg.Inclusive {
		memberArgs = append(memberArgs, "--plain-writes")
	}
	d.cluster, err = kvcluster.New(kvcluster.Options{Bin: d.cfg.Bin, Dir: d.cfg.Dir, Plane: d.plane, Target: d.cfg.Target,
		DrainTimeout: drain})
	if err != nil {
		return err
	}
	d.stopAll = append(d.stopAll, func() {
		err := d.cluster.Stop(10 * time.Second)
		if d.cfg.Plane == nil { // the demo's own plane goes after what runs against it
			err = errors.Join(err, d.plane.Stop(10*time.Second))
		}
		if err != nil {
			d.say("demo: %v", err)
		}
	})
	for i := 1; i <= d.cfg.Members; i++ {
		if _, err := d.cluster.StartCounter(ctx, fmt.Sprintf("c%d", i), d.dsn, memberArgs...); err != nil {
			return err
		}
	}
	conn, err := d.cluster.Dial()
	if err != nil {
		return err
	}
	d.stopAll = append(d.stopAll, func() { conn.Close() })
	d.admin = pb.NewAdminServiceClient(conn)
	return d.startProxy(ctx)
}

// startPlane starts the demo's own control plane, an etcd and an assigner serving the
// counter's config (TargetConfig) as the default target's or as Config.Target's, unless
// Config.Plane gives one.
func (d *demo) startPlane(ctx context.Context) error {
	if d.plane = d.cfg.Plane; d.plane != nil {
		d.pki, d.assigners = d.plane.PKI, d.plane.Assigners()
		return nil
	}
	var err error
	if d.pki, err = launch.NewPKI(filepath.Join(d.cfg.Dir, "pki"), 0); err != nil {
		return err
	}
	opts := kvcluster.PlaneOptions{Bin: d.cfg.Bin, Dir: d.cfg.Dir, PKI: d.pki,
		AssignerArgs: append(slices.Clone(kvcluster.QuickAssignerArgs), PlaneArgs()...), Log: d.cfg.Log}
	if tc := TargetConfig(d.cfg); d.cfg.Target == "" {
		opts.AssignerArgs = append(opts.AssignerArgs, flagsOf(tc)...)
	} else {
		opts.Targets = map[string]registry.Config{d.cfg.Target: tc}
	}
	if d.plane, err = kvcluster.StartPlane(ctx, opts); err != nil {
		return err
	}
	d.assigners = d.plane.Assigners()
	plane := d.plane
	// Stops the plane when start fails before the cluster's stop, which stops it too, is set.
	d.stopAll = append(d.stopAll, func() {
		if err := plane.Stop(10 * time.Second); err != nil {
			d.say("demo: %v", err)
		}
	})
	return nil
}

// startProxy starts the router (with a router's certificate) and the proxy, on loopback,
// and waits for the router's first map.
func (d *demo) startProxy(ctx context.Context) error {
	files, err := d.pki.IssueOf(certs.Request{Target: d.cfg.Target, Kind: "router", Name: "counter-proxy"})
	if err != nil {
		return err
	}
	src, err := files.Load()
	if err != nil {
		return err
	}
	d.router, err = client.NewRouter(client.RouterConfig{Assigners: d.cluster.Assigners(), Target: d.cfg.Target, Policy: client.LeastOutstanding,
		TLS: client.TLS{Cert: files.Cert, Key: files.Key, CA: files.CA}, Logger: d.cfg.Log})
	if err != nil {
		return err
	}
	rctx, rcancel := context.WithCancel(context.Background())
	routed := make(chan error, 1)
	go func() { routed <- d.router.Run(rctx) }()
	d.stopAll = append(d.stopAll, func() { rcancel(); <-routed })
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.router.WaitReady(wctx); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	base := kvclient.HTTPClient(src, 0).Transport
	srv := &http.Server{Handler: counterproxy.New(d.router, base, "https"), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(lis) //nolint:errcheck // it returns when closed
	d.stopAll = append(d.stopAll, func() { srv.Close() })
	d.proxy = "http://" + lis.Addr().String()
	return d.intro()
}

// intro says what runs where, and how to look at it.
func (d *demo) intro() error {
	of := ""
	if d.cfg.Target != "" {
		of = " of target " + d.cfg.Target
	}
	d.say("counter demo: %d members%s (mutual TLS), primary-secondary roles, counts in PostgreSQL; proxy at %s", d.cfg.Members, of, d.proxy)
	if d.cfg.Inclusive {
		d.say("  not exclusive (DEMO_EXCLUSIVE=0): no leases, no fence; a stale primary's increments land")
	} else {
		d.say("  exclusive: primaries hold leases, increments go through the fence (DEMO_EXCLUSIVE=0 turns both off)")
	}
	d.say("  increment: curl -X POST %s/v1/incr/visits", d.proxy)
	admin, err := d.pki.Issue("admin", "demo")
	if err != nil {
		return err
	}
	slicectl := filepath.Join(d.cfg.Bin, "slicectl") + " --assigner " + strings.Join(kvcluster.Addrs(d.assigners), ",") + " " + strings.Join(launch.TLSArgs(admin), " ")
	if d.cfg.Target != "" {
		slicectl += " --target " + d.cfg.Target
	}
	d.say("  inspect:   %s slices --sort load --limit 5   (also: nodes, lookup visits)", slicectl)
	// Flush left, unlike its neighbours: the line is looked for by its first word.
	web, err := d.pki.WebLine(d.assigners[0].Metrics, "demo")
	if err != nil {
		return err
	}
	d.say("%s", web)
	d.say("  counts:    psql '%s' -c 'SELECT * FROM counters ORDER BY count DESC LIMIT 5'", d.dsn)
	return nil
}

// run runs the load, the faults and the live view, then the check.
func (d *demo) run(ctx context.Context) (Summary, error) {
	history := countercheck.NewHistory()
	load := counterload.New(counterload.Config{URL: d.proxy, Client: &http.Client{}, Keys: d.cfg.Keys, Rate: d.cfg.Rate}, history)
	lctx, stopLoad := context.WithCancel(ctx)
	loaded := make(chan struct{})
	go func() { defer close(loaded); load.Run(lctx) }()
	rolled := d.startFaults(lctx)
	imbalance := d.watch(ctx, load)
	stopLoad()
	<-loaded
	if rolled != nil {
		if err := <-rolled; err != nil {
			return Summary{}, err
		}
	}
	if ctx.Err() != nil {
		return Summary{}, ctx.Err()
	}
	pool, err := pgxpool.New(ctx, d.dsn)
	if err != nil {
		return Summary{}, err
	}
	defer pool.Close()
	stored, err := countermember.Stored(ctx, pool)
	if err != nil {
		return Summary{}, err
	}
	return Summary{Imbalance: imbalance, Check: history.Check(stored), paused: d.cfg.Pause}, nil
}

// watch prints, every second, the increments answered and failed and each member's load,
// until the load's time is up; it returns the last imbalance the assigner reported.
func (d *demo) watch(ctx context.Context, load *counterload.Load) float64 {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var end <-chan time.Time
	if d.cfg.Duration > 0 {
		end = time.After(d.cfg.Duration)
	}
	started, imbalance := time.Now(), 0.0
	for {
		select {
		case <-ctx.Done():
			return imbalance
		case <-d.cfg.Stop:
			return imbalance
		case <-end:
			return imbalance
		case <-tick.C:
		}
		sent, failed := load.Counts()
		imbalance = d.line(ctx, time.Since(started), sent, failed)
	}
}

// line prints one line of the live view and returns the imbalance.
func (d *demo) line(ctx context.Context, elapsed time.Duration, sent, failed int64) float64 {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := d.admin.Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		d.say("%3.0fs  sent=%d failed=%d  (status: %v)", elapsed.Seconds(), sent, failed, err)
		return 0
	}
	var parts []string
	if nodes, err := d.admin.ListNodes(ctx, &pb.ListNodesRequest{}); err == nil {
		for _, n := range nodes.GetNodes() {
			parts = append(parts, fmt.Sprintf("%s:%d slices %.0f/s", n.GetNode().GetId(), n.GetSlices(), n.GetLoad()))
		}
	}
	slices.Sort(parts)
	d.say("%3.0fs  sent=%d failed=%d  imbalance=%.2f  %s", elapsed.Seconds(), sent, failed, st.GetImbalance(), strings.Join(parts, "  "))
	return st.GetImbalance()
}

// startFaults, a quarter of the way in (or after 5 s without a Duration), pauses a member
// (Pause) and restarts every member in turn (Roll); nil with neither. The channel gets the
// outcome.
func (d *demo) startFaults(ctx context.Context) <-chan error {
	if !d.cfg.Roll && !d.cfg.Pause {
		return nil
	}
	wait := d.cfg.Duration / 4
	if wait == 0 {
		wait = 5 * time.Second
	}
	out := make(chan error, 1)
	go func() {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			out <- nil
			return
		}
		if d.cfg.Pause {
			d.pause(ctx)
		}
		if d.cfg.Roll {
			out <- d.roll(context.WithoutCancel(ctx))
			return
		}
		out <- nil
	}()
	return out
}

// pauseTTL is the assigners' --node-ttl, the primaries' lease, in a demo that pauses a
// member: the pause lasts twice as long.
const pauseTTL = 3 * time.Second

// pause stops a member (SIGSTOP) for twice its lease, as a long GC pause or a stalled disk
// would, then lets it go on (SIGCONT): its primaries move meanwhile, and what it does when
// it wakes is what the exclusive mode is for.
func (d *demo) pause(ctx context.Context) {
	m := d.cluster.Members("counter")[0]
	pid := m.Proc().Pid()
	d.say("pausing %s (SIGSTOP) for %s, twice its lease: its primaries move; then SIGCONT", m.ID, 2*pauseTTL)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		d.say("demo: pausing %s: %v", m.ID, err)
		return
	}
	select {
	case <-time.After(2 * pauseTTL):
	case <-ctx.Done():
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		d.say("demo: resuming %s: %v", m.ID, err)
	}
	d.say("%s goes on", m.ID)
}

// roll restarts every member in turn.
func (d *demo) roll(ctx context.Context) error {
	for _, m := range d.cluster.Members("counter") {
		d.say("rolling %s: it drains (its primaries demote, its ranges move), stops and starts again", m.ID)
		if err := d.cluster.Roll(ctx, m); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	d.say("every member restarted")
	return nil
}

// ErrCheck is returned when the counts are not a counter's.
var ErrCheck = errors.New("the counts are not a counter's: see the summary")
