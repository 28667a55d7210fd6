// Package assignermain is the assigner binary's command line: flags, config file, logging,
// and the choice between an external etcd cluster and an embedded one.
package assignermain

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/target/registry"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"

	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/etcdlog"
	"github.com/sliceplane/sliceplane/internal/flagfile"
	"github.com/sliceplane/sliceplane/internal/heatmap"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/logging"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/sourceflag"
)

type options struct {
	config        string
	listen        string
	advertise     string
	metrics       string
	history       time.Duration
	historyCells  int
	endpoints     []string
	dataDir       string
	embeddedEtcd  string
	prefix        string
	targets       string
	passInterval  time.Duration
	clockInterval time.Duration
	nodeTTL       time.Duration
	sessionTTL    time.Duration
	estimator     load.EstimatorFlags
	maxLoadRate   float64
	maxReports    float64
	heavySlices   int64
	zoneLabel     string
	mbb           bool
	handoffTO     time.Duration
	roles         string
	exclusive     bool
	handoffLinger time.Duration
	quarantineWin time.Duration
	quarantineTry time.Duration
	firstMapNodes int
	minReplicas   int
	firstMapWait  time.Duration
	algorithm     string
	params        []string
	logLevel      string
	logFormat     string
	tls           mtls.Config
	policy        string
	source        sourceflag.Options
}

// NewCommand returns the assigner command.
func NewCommand() *cobra.Command { return newCommand(&options{}) }

// newCommand returns the assigner command, setting o from its flags.
func newCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "assigner",
		Short: "Run a Sliceplane assigner: keep the slice map balanced and stream its changes",
		Long: `assigner keeps the map of slices of the hash space to storage nodes, runs a
balancing pass every --pass-interval on the load the nodes report, and streams each
change as a quantum stamped with a Lamport clock to distributors and routers.

The items live in the data source: by default under the etcd prefix's data/, or in a
PostgreSQL table (--source postgres --pg-dsn ... --pg-table ...), whose WAL position
is then the clock that stamps the quanta.

State and leadership live in etcd. With --etcd-endpoints it uses that cluster; without,
it starts an embedded etcd in --data-dir, so one command runs a whole control plane.
Run several assigners on the same etcd for fail-over: one leads, the others stand by
and tell clients where the leader is.

With --tls-cert, --tls-key and --tls-ca every link is mutual TLS: callers need a
certificate from the CA, whose identity (spiffe://sliceplane/<kind>/<name>) decides
what they may call (--authz-policy grants more), and the embedded etcd serves https
to clients with such a certificate only. Without them the assigner serves plaintext,
on loopback only unless --insecure (slicectl certs init makes a development set).

Flags can also come from a YAML file (--config), one flag name per key; flags given
on the command line win.`,
		Example: `  # Zero setup: embedded etcd in ./sliceplane-data, gRPC on 127.0.0.1:7070.
  assigner

  # Against an etcd cluster, with a standby on another port.
  assigner --etcd-endpoints http://10.0.0.1:2379,http://10.0.0.2:2379 --listen :7070
  assigner --etcd-endpoints http://10.0.0.1:2379,http://10.0.0.2:2379 --listen :7072 --metrics-listen :7073

  # Tune the algorithm.
  assigner --algorithm weighted-move --param max_churn=0.05 --param dead_band=0.05

  # Spread every slice's replicas over the zones nodes register (client NodeConfig Labels).
  assigner --zone-label zone

  # Mutual TLS on every link, with extra roles from a policy file.
  assigner --listen :7070 --tls-cert certs/assigner-a1.crt --tls-key certs/assigner-a1.key \
    --tls-ca certs/ca.crt --authz-policy policy.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.config != "" {
				if err := flagfile.Load(cmd.Flags(), o.config); err != nil {
					return err
				}
			}
			return o.run(cmd.Context())
		},
		SilenceUsage: true,
		// main prints the error once, with the binary's name.
		SilenceErrors: true,
	}
	f := cmd.Flags()
	o.addServingFlags(f)
	o.addBalancingFlags(f)
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "text or json")
	o.tls.AddFlags(f, true)
	f.StringVar(&o.policy, "authz-policy", "", "YAML file granting identities roles beyond their kind's (needs TLS)")
	o.source.AddFlags(f)
	return cmd
}

// addServingFlags registers where the assigner serves, stores its state and how it times
// leadership, passes and node leases.
func (o *options) addServingFlags(f *pflag.FlagSet) {
	f.StringVar(&o.config, "config", "", "YAML file of flag values (keys are flag names)")
	f.StringVar(&o.listen, "listen", "127.0.0.1:7070", "gRPC address to serve on")
	f.StringVar(&o.advertise, "advertise", "", "address clients should dial to reach this assigner (default: the bound address)")
	f.StringVar(&o.metrics, "metrics-listen", "127.0.0.1:7071", "address serving Prometheus metrics at /metrics and the web view at /ui/ (empty: none)")
	f.DurationVar(&o.history, "history", time.Hour, "how much of the past the web view's heatmap keeps, a column a pass (its memory: docs/OPERATIONS.md)")
	f.IntVar(&o.historyCells, "history-cells", heatmap.DefaultCells, "most cells of a heatmap column, a power of two: a map of more slices is drawn in this many parts of the key space")
	f.StringSliceVar(&o.endpoints, "etcd-endpoints", nil, "etcd cluster endpoints; none starts an embedded etcd in --data-dir")
	f.StringVar(&o.dataDir, "data-dir", "sliceplane-data", "directory of the embedded etcd")
	f.StringVar(&o.embeddedEtcd, "embedded-etcd-listen", "127.0.0.1:2379", "client address of the embedded etcd, for other processes")
	f.StringVar(&o.prefix, "prefix", "/sliceplane/", "etcd key prefix of the cluster's state, election and data")
	f.StringVar(&o.targets, "targets", "", "YAML file of targets (sharded services) to create or update at start, each with its config (docs/OPERATIONS.md)")
	f.DurationVar(&o.passInterval, "pass-interval", time.Second, "time between balancing passes")
	f.DurationVar(&o.clockInterval, "clock-interval", 20*time.Millisecond, "shortest time between clock-only quanta while the source changes")
	f.DurationVar(&o.nodeTTL, "node-ttl", 10*time.Second, "time a node stays in the map without a heartbeat or load report")
	f.DurationVar(&o.sessionTTL, "session-ttl", 5*time.Second, "leader lease: how long standbys wait for a dead leader (whole seconds)")
}

// addBalancingFlags registers how load reports are folded into a forecast and how passes
// balance it.
func (o *options) addBalancingFlags(f *pflag.FlagSet) {
	o.estimator.AddFlags(f)
	f.Float64Var(&o.maxLoadRate, "max-load-rate", load.DefaultRate,
		"most load a node may report per second of its report's window and per unit of its capacity (0 counts as 1), "+
			"in the application's load unit; a report above it, or with a load or key count that is not a finite number >= 0, "+
			"is refused whole (InvalidArgument). The default, 1e9, is a thousand times the requests a second one storage node serves; "+
			"raise it only for a load unit finer than requests")
	f.Float64Var(&o.maxReports, "max-reports-per-second", assigner.DefaultReportsPerSecond,
		"most load reports a member may send a second (bursts of twice that); the rest are dropped before they reach "+
			"its target's leader loop (ResourceExhausted, or a heartbeat's report left out), so that a member that floods "+
			"its leader slows no target; negative: no limit")
	f.Int64Var(&o.heavySlices, "heavy-target-slices", target.HeavySlices,
		"the size, in slices, from which a target is heavy: the assigner that owns it leads no other target, so that its "+
			"passes delay no other's. Give every assigner the same")
	f.StringVar(&o.zoneLabel, "zone-label", "",
		"node label whose value is the node's zone (e.g. zone, or topology.kubernetes.io/zone): passes spread each slice's "+
			"replicas over distinct zones, so that losing one zone leaves every replicated slice a live replica; "+
			"empty ignores zones. Nodes without the label count as one zone")
	f.BoolVar(&o.mbb, "make-before-break", true, "move slices make-before-break: a node gaining a slice loads it while "+
		"the node losing it serves it, until the new node reports it loaded in its heartbeats (or --handoff-timeout passes, "+
		"and the move is rolled back); =false: a move switches readers to the new node at once")
	f.DurationVar(&o.handoffTO, "handoff-timeout", 30*time.Second, "--make-before-break: how long a move may wait for its "+
		"new nodes to load the slice before it is rolled back (the old nodes keep it)")
	f.DurationVar(&o.quarantineWin, "quarantine-window", 0, "quarantine a range when nodes crash twice (their leases lapse, "+
		"no deregistration) within this long of each other, each within it of acquiring the range: it is then held by no node "+
		"until slicectl unquarantine (0: three --node-ttl; negative: no quarantine)")
	f.DurationVar(&o.quarantineTry, "quarantine-probe", 0, "narrow a quarantine by bisection: lend half of it to one live "+
		"node, the canary; if the canary crashes, the quarantine narrows to that half, and if it serves the half this long "+
		"once it has loaded it, to the other half; down to 1/1024 of the key space (0: --quarantine-window; "+
		"negative: no narrowing, a quarantine stays whole until slicectl unquarantine)")
	f.IntVar(&o.firstMapNodes, "first-map-nodes", 0, "a cluster's first map waits until this many nodes are registered "+
		"(or --first-map-wait passes), instead of giving every slice to the first nodes of a starting fleet (0: no wait)")
	f.DurationVar(&o.firstMapWait, "first-map-wait", time.Minute, "--first-map-nodes: the longest the first map waits, from "+
		"the leader's start")
	f.DurationVar(&o.handoffLinger, "handoff-linger", 2*time.Second, "--make-before-break: how long the old nodes keep "+
		"serving a slice once its new nodes have loaded it, for routers that have not yet seen the new nodes serve")
	f.StringVar(&o.roles, "roles", assignment.Replicas.Name, "the replicas' roles: "+rolesHelp()+
		"; give every assigner the same, and members the same (client.MemberConfig.Roles)")
	f.BoolVar(&o.exclusive, "exclusive", false, "primaries hold leases (--node-ttl long, renewed by heartbeats) and fencing tokens: a primary role "+
		"goes to another member only once the old primary gave it up or its lease ran out, even across a failover (needs --roles "+
		core.RolesPrimarySecondary+"; give every assigner the same)")
	f.IntVar(&o.minReplicas, "min-replicas", 1, "replicas every slice keeps while that many nodes live (warm secondaries): "+
		"with 2, a primary that dies is replaced at once by a secondary that already holds its range, instead of by a member that "+
		"must load it; each replica is a copy of the slice's state, kept outside the churn budget")
	f.StringVar(&o.algorithm, "algorithm", "weighted-move", "balancing algorithm when none is stored: "+strings.Join(balance.Names(), ", "))
	f.StringArrayVar(&o.params, "param", nil, "algorithm constant NAME=VALUE (repeatable); see slicectl sim --help")
}

// security loads the TLS files and the policy, saying which flag is wrong, before anything
// starts.
func (o *options) security() (*mtls.Source, *authz.Policy, error) {
	for _, f := range []struct{ flag, path string }{{"--tls-cert", o.tls.Cert}, {"--tls-key", o.tls.Key}, {"--tls-ca", o.tls.CA}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return nil, nil, fmt.Errorf("assigner: %s: %w", f.flag, err)
		}
	}
	src, policy, err := authz.LoadServer(o.tls, o.policy)
	if err != nil {
		return nil, nil, fmt.Errorf("assigner: %w", err)
	}
	if err := mtls.CheckEndpoints(src, o.endpoints); err != nil {
		return nil, nil, fmt.Errorf("assigner: %w", err)
	}
	return src, policy, nil
}

func (o *options) logger() (*slog.Logger, error) {
	return logging.New(os.Stderr, o.logLevel, o.logFormat)
}

func (o *options) run(ctx context.Context) error {
	log, err := o.logger()
	if err != nil {
		return err
	}
	params, err := balance.ParseParams(o.params)
	if err != nil {
		return err
	}
	est, err := o.estimator.Config()
	if err != nil {
		return fmt.Errorf("assigner: %w", err)
	}
	src, policy, err := o.security()
	if err != nil {
		return err
	}
	cfg := assigner.Config{
		Listen: o.listen, Advertise: o.advertise, MetricsListen: o.metrics, Prefix: o.prefix,
		PassInterval: o.passInterval, ClockInterval: o.clockInterval, SessionTTL: o.sessionTTL,
		MaxReportsPerSecond: o.maxReports, HeavySlices: o.heavySlices,
		Core:   o.coreConfig(params, est),
		Logger: log, TLS: src, Policy: policy, Insecure: o.tls.Insecure,
		History: heatmap.Config{Columns: int(o.history / max(o.passInterval, time.Millisecond)), Cells: o.historyCells},
	}
	if o.heavySlices < 1 {
		return fmt.Errorf("assigner: --heavy-target-slices %d: want at least 1", o.heavySlices)
	}
	if o.maxReports == 0 {
		return fmt.Errorf("assigner: --max-reports-per-second 0: want more than 0, or a negative number for no limit")
	}
	if o.history < 2*o.passInterval {
		return fmt.Errorf("assigner: --history %s: the heatmap keeps at least two passes (--pass-interval %s)", o.history, o.passInterval)
	}
	if err := (heatmap.Config{Cells: o.historyCells}).Validate(); err != nil || o.historyCells == 0 {
		return fmt.Errorf("assigner: --history-cells %d: want a power of two from 1 to 65536", o.historyCells)
	}
	if cfg.Targets, err = o.declaredTargets(); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil { // before starting anything
		return err
	}
	if err := o.source.Validate(); err != nil {
		return fmt.Errorf("assigner: %w", err)
	}
	pg, err := o.source.Open(ctx, "", log, nil) // the leader follows only the clock: no slot
	if err != nil {
		return fmt.Errorf("assigner: %w", err)
	}
	if pg != nil {
		defer pg.Close()
		cfg.Source = pg
	}
	endpoints := o.endpoints
	if len(endpoints) == 0 {
		etcd, err := o.startEtcd(ctx, log)
		if err != nil {
			return err
		}
		defer etcd.Close()
		endpoints = []string{etcd.Endpoint()}
	}
	cfg.Client, err = clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Context: ctx,
		Logger: etcdlog.New(log, zapcore.WarnLevel, nil), TLS: src.ClientTLS()})
	if err != nil {
		return fmt.Errorf("assigner: connecting to etcd %v: %w", endpoints, err)
	}
	defer cfg.Client.Close()
	srv, err := assigner.New(cfg)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

// declaredTargets reads the --targets file, if any.
func (o *options) declaredTargets() ([]registry.Record, error) {
	if o.targets == "" {
		return nil, nil
	}
	data, err := os.ReadFile(o.targets)
	if err == nil {
		var recs []registry.Record
		if recs, err = registry.ParseFile(data); err == nil {
			return recs, nil
		}
	}
	return nil, fmt.Errorf("assigner: --targets %s: %w", o.targets, err)
}

// coreConfig returns the core's settings from the flags.
func (o *options) coreConfig(params map[string]string, est load.EstimatorConfig) core.Config {
	return core.Config{NodeTTL: o.nodeTTL, Algorithm: o.algorithm, Params: params,
		Estimator: est, MaxLoadRate: o.maxLoadRate, ZoneLabel: o.zoneLabel,
		BreakBeforeMake: !o.mbb, HandoffTimeout: o.handoffTO, HandoffLinger: o.handoffLinger, Roles: o.roles, Exclusive: o.exclusive,
		QuarantineWindow: o.quarantineWin, QuarantineProbe: o.quarantineTry, FirstMapNodes: o.firstMapNodes, FirstMapWait: o.firstMapWait,
		MinReplicas: o.minReplicas}
}

// startEtcd starts the embedded etcd in --data-dir, serving its clients with the process's
// TLS files if it has them.
func (o *options) startEtcd(ctx context.Context, log *slog.Logger) (*embedetcd.Server, error) {
	dir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return nil, err
	}
	etcd, err := embedetcd.Start(ctx, embedetcd.Options{Dir: dir, ClientAddr: o.embeddedEtcd, Logger: log, TLS: o.tls})
	if err != nil {
		return nil, fmt.Errorf("assigner: the embedded etcd (--data-dir %s, --embedded-etcd-listen %s): %w", o.dataDir, o.embeddedEtcd, err)
	}
	log.Info("embedded etcd started", "endpoint", etcd.Endpoint(), "dir", dir, "tls", o.tls.Enabled())
	return etcd, nil
}

// rolesHelp describes each role model for --roles.
func rolesHelp() string {
	var out []string
	for _, m := range assignment.RoleModels() {
		out = append(out, m.Name+" ("+m.Help+")")
	}
	return strings.Join(out, " or ")
}
