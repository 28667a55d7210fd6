// Package demo runs Sliceplane's one-command demo: an embedded etcd, an assigner, two
// distributors and four nodes of the example key-value store as separate processes on
// loopback, and a load generator whose hot keys move half-way, with a live view of the
// load on each node, and a final check that nothing was lost.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/pgwriter"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcheck"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	"github.com/sliceplane/sliceplane/examples/kvstore/loadgen"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
)

// Config shapes the demo.
type Config struct {
	// Bin holds the binaries (kvcluster.Binaries); Dir, the demo's data and logs.
	Bin, Dir string
	// Duration stops the load after this long and runs the final check; 0 runs until Stop
	// is closed, and checks then. (Cancelling Run's ctx abandons the demo, check included.)
	Duration time.Duration
	Stop     <-chan struct{}
	// Keys, ReadRate and WriteRate shape the load; Nodes is the number of nodes.
	Keys                int
	ReadRate, WriteRate float64
	Nodes               int
	// Plaintext runs every link without TLS. By default the demo makes a throwaway CA in
	// Dir/pki and runs every process with mutual TLS, as a deployment should.
	Plaintext bool
	// Source is where the items live: "etcd" (the default, under the embedded etcd's data
	// prefix) or "postgres" (a table of a throwaway PostgreSQL server the demo starts in
	// Dir/postgres, read by logical replication; needs the server's binaries).
	Source string
	// Roll restarts every node in turn while the load runs, as an orchestrator's rolling
	// restart does: each drains on SIGTERM (its slices handed off make-before-break), stops,
	// and starts again with its data. The summary's failed and misses say what readers saw.
	// RollAfter is when the roll begins, after the load starts; 0 means a quarter of the
	// way through a timed demo (half the hot keys' period otherwise).
	Roll      bool
	RollAfter time.Duration
	// Plane, when set, is a control plane started elsewhere, which the demo's distributors
	// and nodes join as its default target (the two-target demo): the demo then starts no
	// etcd and no assigner, and its items are in the plane's etcd. Plaintext is the plane's.
	Plane *kvcluster.Plane
	// Out receives the live view; Log, diagnostics.
	Out io.Writer
	Log *slog.Logger
}

// Summary is the demo's outcome.
type Summary struct {
	// Imbalance is the true imbalance of the last seconds of load: the reads each node
	// served, max over mean.
	Imbalance float64
	// Items is the number of items in the source; Lost, Leaked and Stale what the
	// convergence checker found amiss.
	Items, Lost, Leaked, Stale int
	// Misses counts the reads of an existing key answered "not found", Failed those no
	// replica answered (loadgen.Stats).
	Misses, Failed uint64
	// Rolled counts the nodes a rolling restart (Config.Roll) restarted.
	Rolled int
}

func (s Summary) String() string {
	line := fmt.Sprintf("final imbalance=%.2f items=%d lost=%d misses=%d failed=%d", s.Imbalance, s.Items, s.Lost, s.Misses, s.Failed)
	if s.Leaked+s.Stale > 0 {
		line += fmt.Sprintf(" leaked=%d stale=%d", s.Leaked, s.Stale)
	}
	return line
}

// ErrNotHeld is returned when the nodes do not hold what they must.
var ErrNotHeld = errors.New("the nodes do not hold what they must")

// Err returns ErrNotHeld when the convergence check found items lost, leaked or stale.
func (s Summary) Err() error {
	if s.Lost+s.Leaked+s.Stale > 0 {
		return ErrNotHeld
	}
	return nil
}

// window is how many seconds of reads the imbalance is measured over.
const window = 5

// Run runs the demo until cfg.Duration passes or cfg.Stop is closed, then checks the
// cluster; it stops every process on the way out, also when ctx ends first. The summary is
// valid when err is nil.
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
	if cfg.Keys == 0 {
		cfg.Keys = 10000
	}
	if cfg.ReadRate == 0 {
		cfg.ReadRate = 1000
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 4
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	d := &demo{cfg: cfg, out: cfg.Out}
	if err := d.start(ctx); err != nil {
		d.stop()
		return nil, err
	}
	return &Started{d: d}, nil
}

// Run runs the load until Config.Duration passes or Config.Stop is closed, then checks the
// cluster, as Run does; the processes go on until Stop.
func (s *Started) Run(ctx context.Context) (Summary, error) { return s.d.run(ctx) }

// Stop stops every process Start started.
func (s *Started) Stop() { s.d.stop() }

type demo struct {
	cfg   Config
	out   io.Writer
	pki   *launch.PKI
	plane *kvcluster.Plane
	cli   *clientv3.Client
	// writer writes the items; sourceArgs tell the assigner and distributors where they are.
	writer     loadgen.Writer
	sourceArgs []string
	dsn        string // of the PostgreSQL source, if it is the source
	cluster    *kvcluster.Cluster
	conn       *grpc.ClientConn
	admin      pb.AdminServiceClient
	src        source.Writer
	router     *client.Router
	// http reads from the nodes for the load generator.
	http    *http.Client
	stopAll []func()
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.out, format+"\n", args...) }

// stop stops everything start started, in reverse order.
func (d *demo) stop() {
	for i := len(d.stopAll) - 1; i >= 0; i-- {
		d.stopAll[i]()
	}
}

func (d *demo) start(ctx context.Context) error {
	started := time.Now()
	if err := d.startPlane(ctx); err != nil {
		return err
	}
	if err := d.connectEtcd(); err != nil {
		return err
	}
	var err error
	var drain time.Duration
	if d.cfg.Roll {
		drain = rollDrain
	}
	d.cluster, err = kvcluster.New(kvcluster.Options{Bin: d.cfg.Bin, Dir: d.cfg.Dir, Plane: d.plane, DrainTimeout: drain,
		DistributorArgs: append([]string{"--log-format", "json"}, d.sourceArgs...),
		NodeArgs:        []string{"--report-interval", "500ms", "--log-format", "json"}})
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
		} else {
			d.say("every process stopped cleanly")
		}
	})
	for _, id := range []string{"d1", "d2"} {
		if _, err := d.cluster.StartDistributor(ctx, id); err != nil {
			return err
		}
	}
	for i := 1; i <= d.cfg.Nodes; i++ {
		if _, err := d.cluster.StartNode(ctx, fmt.Sprintf("n%d", i)); err != nil {
			return err
		}
	}
	if d.conn, err = d.cluster.Dial(); err != nil {
		return err
	}
	d.stopAll = append(d.stopAll, func() { d.conn.Close() })
	d.admin = pb.NewAdminServiceClient(d.conn)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = launch.WaitFor(wctx, "every node in the map", 100*time.Millisecond, func(ctx context.Context) error {
		resp, err := d.admin.ListNodes(ctx, &pb.ListNodesRequest{})
		if err != nil {
			return err
		}
		if n := len(resp.GetNodes()); n < d.cfg.Nodes {
			return fmt.Errorf("%d of %d nodes registered", n, d.cfg.Nodes)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := d.startRouter(wctx); err != nil {
		return err
	}
	return d.intro(started)
}

// startPlane starts the demo's own control plane, an etcd and an assigner that reads the
// items from the source (Config.Source), unless Config.Plane gives one.
func (d *demo) startPlane(ctx context.Context) error {
	if d.cfg.Plane != nil {
		if d.cfg.Source != "" && d.cfg.Source != "etcd" {
			return fmt.Errorf("demo: source %q: a shared control plane's items are in its etcd", d.cfg.Source)
		}
		d.plane, d.pki = d.cfg.Plane, d.cfg.Plane.PKI
		return nil
	}
	if !d.cfg.Plaintext {
		var err error
		if d.pki, err = launch.NewPKI(filepath.Join(d.cfg.Dir, "pki"), 0); err != nil {
			return err
		}
	}
	if err := d.startPostgres(ctx); err != nil {
		return err
	}
	plane, err := kvcluster.StartPlane(ctx, kvcluster.PlaneOptions{Bin: d.cfg.Bin, Dir: d.cfg.Dir, PKI: d.pki,
		AssignerArgs: append(slices.Clone(kvcluster.QuickAssignerArgs), d.sourceArgs...), Log: d.cfg.Log})
	if err != nil {
		return err
	}
	d.plane = plane
	// Stops the plane when start fails before the cluster's stop, which stops it too, is set.
	d.stopAll = append(d.stopAll, func() {
		if err := plane.Stop(10 * time.Second); err != nil {
			d.say("demo: %v", err)
		}
	})
	return nil
}

// startRouter starts the load generator's router and waits for its first map; ctx bounds
// the wait.
func (d *demo) startRouter(ctx context.Context) error {
	// A router's identity: it reads the map and lists the nodes for their addresses.
	files, err := d.pki.Issue("router", "demo-load")
	if err != nil {
		return err
	}
	d.router, err = client.NewRouter(client.RouterConfig{Assigners: d.cluster.Assigners(), Policy: client.LeastOutstanding,
		TLS: client.TLS{Cert: files.Cert, Key: files.Key, CA: files.CA}, Logger: d.cfg.Log})
	if err != nil {
		return err
	}
	src, err := files.Load()
	if err != nil {
		return err
	}
	d.http = kvclient.HTTPClient(src, 5*time.Second)
	rctx, rcancel := context.WithCancel(context.Background())
	routed := make(chan error, 1)
	go func() { routed <- d.router.Run(rctx) }()
	d.stopAll = append(d.stopAll, func() { rcancel(); <-routed })
	if err := d.router.WaitReady(ctx); err != nil {
		return fmt.Errorf("demo: waiting for the router's first map: %w", err)
	}
	return nil
}

// connectEtcd connects the demo's client to the plane's etcd, which is the data source
// unless PostgreSQL is.
func (d *demo) connectEtcd() error {
	tls, err := d.pki.Source("admin", "demo-writer")
	if err != nil {
		return err
	}
	d.cli, err = clientv3.New(clientv3.Config{Endpoints: d.plane.Etcd(), DialTimeout: 5 * time.Second,
		TLS: tls.ClientTLS(), Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("demo: connecting to etcd: %w", err)
	}
	d.stopAll = append(d.stopAll, func() { d.cli.Close() })
	if d.src == nil {
		d.src, d.writer = source.NewEtcd(d.cli, writer.DefaultPrefix), writer.New(d.cli, writer.DefaultPrefix)
	}
	return nil
}

// startPostgres starts, with Config.Source "postgres", a throwaway PostgreSQL server with
// the items table, and makes it the demo's source; the etcd stays, for the assigner's state.
func (d *demo) startPostgres(ctx context.Context) error {
	switch d.cfg.Source {
	case "", "etcd":
		return nil
	case "postgres":
	default:
		return fmt.Errorf("demo: source %q: want etcd or postgres", d.cfg.Source)
	}
	pg, err := pgcluster.Start(ctx, filepath.Join(d.cfg.Dir, "postgres"), pgcluster.Options{})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.stopAll = append(d.stopAll, func() { pg.Stop() }) //nolint:errcheck // throwaway
	if err := postgres.Init(ctx, postgres.Config{DSN: pg.DSN}); err != nil {
		return err
	}
	src, err := postgres.Open(ctx, postgres.Config{DSN: pg.DSN, Logger: d.cfg.Log})
	if err != nil {
		return err
	}
	w, err := pgwriter.Open(ctx, pgwriter.Config{DSN: pg.DSN})
	if err != nil {
		src.Close()
		return err
	}
	d.stopAll = append(d.stopAll, src.Close, w.Close)
	d.src, d.writer, d.dsn = src, w, pg.DSN
	d.sourceArgs = []string{"--source", "postgres", "--pg-dsn", pg.DSN}
	return nil
}

// intro says what runs where, and how to look at it.
func (d *demo) intro(started time.Time) error {
	assigners := d.plane.Assigners()
	d.say("Sliceplane demo: etcd, %s, 2 distributors, %d kvstore nodes on loopback, %s (up in %s)", count(len(assigners), "assigner"),
		d.cfg.Nodes, d.security(), time.Since(started).Round(100*time.Millisecond))
	if err := d.endpoints(assigners); err != nil {
		return err
	}
	slicectl := filepath.Join(d.cfg.Bin, "slicectl") + " --assigner " + strings.Join(d.cluster.Assigners(), ",")
	if d.pki != nil {
		env, err := d.slicectlEnv()
		if err != nil {
			return err
		}
		admin, err := d.pki.Issue("admin", "demo")
		if err != nil {
			return err
		}
		d.say("  inspect:   %s %s status", slicectl, strings.Join(launch.TLSArgs(admin), " "))
		d.say("             or: source %s; %s status", env, slicectl)
		d.say("             (also: nodes, slices, explain, quanta --follow; admin certificate spiffe://sliceplane/admin/demo)")
		d.say("  curl:      curl --cacert %s --cert %s --key %s https://%s/v1/state", admin.CA, admin.Cert, admin.Key,
			d.cluster.Members("node")[0].Addr)
	} else {
		d.say("  inspect:   %s status   (also: nodes, slices, explain, quanta --follow)", slicectl)
	}
	if d.dsn != "" {
		d.say("  source:    PostgreSQL, table sliceplane_items: psql '%s'", d.dsn)
	}
	d.say("  logs:      %s (kvdemo --keep keeps them)", d.cluster.LogDir())
	return nil
}

// endpoints says where the metrics and the web view are; the web view's line comes with the
// admin's PKCS#12 file, which it names.
func (d *demo) endpoints(assigners []*kvcluster.Member) error {
	scheme := "http"
	if d.pki != nil {
		scheme = "https"
	}
	d.say("  metrics:   %s %s, distributors %s, nodes %s", plural(len(assigners), "assigner"), metricsOf(scheme, assigners),
		metricsOf(scheme, d.cluster.Members("distributor")), metricsOf(scheme, d.cluster.Members("node")))
	d.say("  dashboard: deploy/grafana/sliceplane.json (import into Grafana; Prometheus scrapes the endpoints above)")
	// Flush left, unlike its neighbours: the line is looked for by its first word.
	web, err := d.pki.WebLine(assigners[0].Metrics, "demo")
	if err != nil {
		return err
	}
	d.say("%s", web)
	return nil
}

// mode is the live view's word on security.
func (d *demo) mode() string {
	if d.pki == nil {
		return "plaintext"
	}
	return "mTLS on"
}

// security says in a few words how the links are secured, for the live view.
func (d *demo) security() string {
	if d.pki == nil {
		return "plaintext (--plaintext)"
	}
	return "mTLS on (throwaway CA in " + d.pki.Dir + ")"
}

// slicectlEnv writes the environment of an admin's slicectl, to source in a shell, and
// returns its path.
func (d *demo) slicectlEnv() (string, error) {
	admin, err := d.pki.Issue("admin", "demo")
	if err != nil {
		return "", err
	}
	path := filepath.Join(d.cfg.Dir, "slicectl.env")
	env := fmt.Sprintf("export SLICEPLANE_TLS_CERT=%s\nexport SLICEPLANE_TLS_KEY=%s\nexport SLICEPLANE_TLS_CA=%s\n",
		admin.Cert, admin.Key, admin.CA)
	if err := os.WriteFile(path, []byte(env), 0o600); err != nil {
		return "", fmt.Errorf("demo: %w", err)
	}
	return path, nil
}

// count returns "1 thing" or "n things".
func count(n int, thing string) string { return fmt.Sprintf("%d %s", n, plural(n, thing)) }

// plural returns thing, with an s unless n is 1.
func plural(n int, thing string) string {
	if n == 1 {
		return thing
	}
	return thing + "s"
}

func metricsOf(scheme string, ms []*kvcluster.Member) string {
	var out []string
	for _, m := range ms {
		out = append(out, scheme+"://"+m.Metrics+"/metrics")
	}
	return strings.Join(out, " ")
}

// run fills the store, drives the load with a live view, and checks the end state.
func (d *demo) run(ctx context.Context) (Summary, error) {
	// The hot keys move once, half-way through a timed demo (every 20 s otherwise), leaving
	// the second half to rebalance.
	period := 20 * time.Second
	if d.cfg.Duration > 0 {
		period = max(d.cfg.Duration/2, 5*time.Second)
	}
	g, err := loadgen.New(loadgen.Config{Writer: d.writer, Router: d.router, HTTP: d.http, Keys: d.cfg.Keys,
		Workload: fmt.Sprintf("hotspot-shift:1.1:%d", int(period/time.Second)), ReadRate: d.cfg.ReadRate, WriteRate: d.cfg.WriteRate,
		Seed: 1, Logger: d.cfg.Log})
	if err != nil {
		return Summary{}, err
	}
	filled := time.Now()
	if _, err := g.Fill(ctx); err != nil {
		return Summary{}, err
	}
	if err := d.settle(ctx); err != nil {
		return Summary{}, err
	}
	d.say("wrote %d items in %s; reading %.0f keys/s with Zipf 1.1 popularity; the hot keys move every %s",
		d.cfg.Keys, time.Since(filled).Round(time.Millisecond), d.cfg.ReadRate, period)
	d.say("imbalance: max/mean of the reads each node served; the assigner's estimate: its forecast of the same for")
	d.say("  the map in force. They differ by the noise of a few seconds of reads, and after the hot keys move until passes catch up")
	if d.cfg.Duration == 0 {
		d.say("Ctrl-C stops the load, checks that nothing was lost, and stops every process")
	}

	lctx, stopLoad := d.loadContext(ctx)
	defer stopLoad()
	loaded := make(chan error, 1)
	go func() { loaded <- g.Run(lctx) }()
	after := d.cfg.RollAfter
	if after == 0 {
		after = period / 2
	}
	rolled := d.startRoll(ctx, lctx, after)
	history, restarted, err := d.watch(ctx, lctx, g, period, rolled)
	stopLoad()
	<-loaded
	if rolled != nil {
		for ev := range rolled { // a roll goes on to finish its node
			d.say("  >>> %s", ev.line)
			restarted += ev.restarted
		}
	}
	switch {
	case err != nil:
		return Summary{}, err
	case len(history) < 2:
		return Summary{}, ErrNoLoad
	}
	s, err := d.finish(ctx, history)
	s.Rolled = restarted
	return s, err
}

// loadContext returns the context the load runs in: it ends after Config.Duration, when
// Config.Stop is closed, or when cancelled.
func (d *demo) loadContext(ctx context.Context) (context.Context, context.CancelFunc) {
	lctx, stopLoad := context.WithCancel(ctx)
	if d.cfg.Duration > 0 {
		var cancel context.CancelFunc
		lctx, cancel = context.WithTimeout(lctx, d.cfg.Duration)
		stop := stopLoad
		stopLoad = func() { cancel(); stop() }
	}
	if d.cfg.Stop != nil {
		stopped, done := d.cfg.Stop, lctx.Done()
		go func() {
			select {
			case <-stopped:
				stopLoad()
			case <-done:
			}
		}()
	}
	return lctx, stopLoad
}

// watch prints the live view every second until the load ends, and what a rolling restart
// says as it goes; it returns the load generator's stats of each second and the nodes the
// roll restarted so far. A roll's later events stay on its channel.
func (d *demo) watch(ctx, load context.Context, g *loadgen.Generator, period time.Duration, rolled <-chan rollEvent) ([]loadgen.Stats, int, error) {
	start := time.Now()
	var history []loadgen.Stats
	restarted := 0
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for shifts := 1; ; {
		select {
		case <-load.Done():
			return history, restarted, nil
		case <-tick.C:
			history = append(history, g.Stats())
			if exited := errors.Join(d.plane.Exited(), d.cluster.Exited()); exited != nil {
				return nil, restarted, fmt.Errorf("demo: a process died: %w", exited)
			}
			elapsed := time.Since(start)
			if at := time.Duration(shifts) * period; elapsed >= at && (d.cfg.Duration == 0 || at < d.cfg.Duration) {
				d.say("  >>> the hot keys move now")
				shifts++
			}
			d.view(ctx, elapsed, history)
		case ev, ok := <-rolled:
			if !ok {
				rolled = nil
				continue
			}
			d.say("  >>> %s", ev.line)
			restarted += ev.restarted
		}
	}
}

// rollDrain bounds each node's drain in a rolling restart (kvnode's --drain-timeout).
const rollDrain = 30 * time.Second

// rollEvent is what a rolling restart says: a line for the live view, and whether a node
// is back (1) or not (0).
type rollEvent struct {
	line      string
	restarted int
}

// startRoll restarts every node in turn (Config.Roll), from after wait of the load on, and
// says how each went on the channel it returns, which it closes when done; nil without
// Roll. A roll under way when load ends finishes its node, so that the final check finds
// every node up; the rest are left.
func (d *demo) startRoll(ctx, load context.Context, wait time.Duration) <-chan rollEvent {
	if !d.cfg.Roll {
		return nil
	}
	out := make(chan rollEvent, len(d.cluster.Members("node"))+1)
	go func() {
		defer close(out)
		select {
		case <-time.After(wait):
		case <-load.Done():
			return
		}
		out <- rollEvent{line: "rolling restart: each node in turn drains on SIGTERM, stops and starts again"}
		for _, m := range d.cluster.Members("node") {
			if load.Err() != nil {
				return
			}
			began := time.Now()
			if err := d.cluster.Roll(ctx, m); err != nil {
				out <- rollEvent{line: fmt.Sprintf("%s: %v", m.ID, err)}
				return
			}
			out <- rollEvent{line: fmt.Sprintf("%s drained, stopped and back in %s", m.ID, time.Since(began).Round(100*time.Millisecond)), restarted: 1}
		}
	}()
	return out
}

// rates returns the reads each node served per second over the last n seconds of history,
// and the total read rate.
func rates(history []loadgen.Stats, n int) (map[string]float64, float64) {
	if len(history) < 2 {
		return nil, 0
	}
	n = min(n, len(history)-1)
	last, first := history[len(history)-1], history[len(history)-1-n]
	out := map[string]float64{}
	for id, c := range last.Served {
		out[id] = float64(c-first.Served[id]) / float64(n)
	}
	return out, float64(last.Reads-first.Reads) / float64(n)
}

// imbalance is max over mean of the nodes' rates (load.Imbalance); nodes that served
// nothing count. With nothing served at all there is no figure: 0.
func imbalance(r map[string]float64, nodes []string) float64 {
	xs := make([]float64, len(nodes))
	for i, id := range nodes {
		xs[i] = r[id]
	}
	if len(xs) == 0 || slices.Max(xs) == 0 {
		return 0
	}
	return load.Imbalance(xs)
}

const barWidth = 30

// view prints one frame of the live view.
func (d *demo) view(ctx context.Context, elapsed time.Duration, history []loadgen.Stats) {
	ctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
	defer cancel()
	status, err := d.admin.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		d.say("[%3ds] assigner: %v", int(elapsed.Seconds()), err)
		return
	}
	nodes, err := d.admin.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		d.say("[%3ds] assigner: %v", int(elapsed.Seconds()), err)
		return
	}
	var churn float64
	if ex, err := d.admin.Explain(ctx, &pb.ExplainRequest{}); err == nil && ex.GetPassed() {
		churn = ex.GetChurnMove() + ex.GetChurnMerge() + ex.GetChurnCleanup()
	}
	items, err := kvcheck.Items(ctx, d.src)
	if err != nil {
		d.say("[%3ds] source: %v", int(elapsed.Seconds()), err)
		return
	}
	perNode, total := rates(history, window)
	now, _ := rates(history, 1)
	ids := make([]string, 0, len(nodes.GetNodes()))
	slicesOf := map[string]uint32{}
	for _, n := range nodes.GetNodes() {
		ids = append(ids, n.GetNode().GetId())
		slicesOf[n.GetNode().GetId()] = n.GetSlices()
	}
	slices.Sort(ids)
	imb := "-"
	if total > 0 {
		imb = fmt.Sprintf("%.2f", imbalance(perNode, ids))
	}
	d.say("[%3ds] %s  imbalance %s (last %ds; assigner's estimate %.2f)  slices %d  churn %.1f%%  items %d  reads %.0f/s",
		int(elapsed.Seconds()), d.mode(), imb, window, status.GetImbalance(), status.GetSlices(), 100*churn, items, total)
	var top float64
	for _, id := range ids {
		top = max(top, now[id])
	}
	for _, id := range ids {
		filled := 0
		if top > 0 {
			filled = int(now[id] / top * barWidth)
		}
		d.say("   %-4s %s%s %5.0f/s  %3d slices", id, strings.Repeat("█", filled), strings.Repeat("░", barWidth-filled), now[id], slicesOf[id])
	}
}

// finish freezes the map, checks that every node holds exactly what it must, and sums up.
func (d *demo) finish(ctx context.Context, history []loadgen.Stats) (Summary, error) {
	nodes := slices.Sorted(maps.Keys(d.cluster.NodeURLs()))
	perNode, _ := rates(history, window)
	last := history[len(history)-1]
	s := Summary{Imbalance: imbalance(perNode, nodes), Misses: last.Misses, Failed: last.Failed}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	d.say("load stopped; checking that every node holds exactly what it must")
	if _, err := d.admin.Freeze(cctx, &pb.FreezeRequest{Reason: "demo: final check"}); err != nil {
		return s, fmt.Errorf("demo: freezing the map for the check: %w", err)
	}
	checker := &kvcheck.Checker{Source: d.src, Assigner: d.conn, Nodes: d.cluster.Nodes()}
	r, err := checker.Wait(cctx)
	if err != nil {
		return s, fmt.Errorf("demo: %w", err)
	}
	// Drains move slices in passes: nodes that drain as they stop need them back.
	if _, err := d.admin.Unfreeze(cctx, &pb.UnfreezeRequest{}); err != nil {
		return s, fmt.Errorf("demo: unfreezing the map after the check: %w", err)
	}
	items, err := kvcheck.Items(cctx, d.src)
	if err != nil {
		return s, err
	}
	s.Items, s.Lost, s.Leaked, s.Stale = items, r.Missing, r.Leaked, r.Stale
	d.say("%d reads: %d hits, %d misses, %d failed; on the way %d misdirected, %d beyond freshness, %d errors; %d writes; convergence check: %s",
		last.Reads, last.Hits, last.Misses, last.Failed, last.Misdirected, last.Stale, last.Errors, last.Writes, r)
	return s, nil
}

// settle waits until every node holds what the fill wrote: reads start against a service in
// its steady state, so that what they see is what moves and faults do, not the nodes'
// first snapshot still arriving (a node answers "not mine yet" while it loads; with no
// other replica to ask, such a read fails).
func (d *demo) settle(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	checker := &kvcheck.Checker{Source: d.src, Assigner: d.conn, Nodes: d.cluster.Nodes()}
	if _, err := checker.Wait(cctx); err != nil {
		return fmt.Errorf("demo: waiting for the nodes to take in the fill: %w", err)
	}
	return nil
}

// ErrNoLoad is returned when the demo stopped before any load was measured.
var ErrNoLoad = errors.New("demo: stopped before any load was measured")
