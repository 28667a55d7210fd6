// Package distributormain is the distributor binary's command line: flags, config file and
// logging around the distributor service.
package distributormain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"

	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/cli"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/etcdlog"
	"github.com/sliceplane/sliceplane/internal/flagfile"
	"github.com/sliceplane/sliceplane/internal/logging"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/sourceflag"
	"github.com/sliceplane/sliceplane/internal/target"
)

// ErrUsage is wrapped by errors about how the command was called (bad flags, arguments or
// config file): cli.ErrUsage, which main reports with exit status 2.
var ErrUsage = cli.ErrUsage

type usage struct{ error }

func (u usage) Unwrap() []error { return []error{u.error, ErrUsage} }

func usageError(err error) error { return usage{err} }

func usagef(format string, args ...any) error { return usageError(fmt.Errorf(format, args...)) }

// hostname is os.Hostname, replaced by tests.
var hostname = os.Hostname

type options struct {
	config           string
	id               string
	listen           string
	advertise        string
	metrics          string
	assigners        []string
	endpoints        []string
	prefix           string
	targets          []string
	sources          string
	sessionTTL       time.Duration
	maxDeltaOps      int
	maxDeltaBytes    byteSize
	maxInFlightBytes byteSize
	maxQueueBytes    byteSize
	maxBufferedBytes byteSize
	maxScanAhead     byteSize
	scanWorkers      int
	clockInterval    time.Duration
	logLevel         string
	logFormat        string
	tls              mtls.Config
	authzPolicy      string
	source           sourceflag.Options
}

// NewCommand returns the distributor command.
func NewCommand() *cobra.Command {
	o := &options{
		maxDeltaBytes: 1 << 20, maxInFlightBytes: 4 << 20, maxQueueBytes: 64 << 20, maxBufferedBytes: 64 << 20,
		maxScanAhead: 8 << 20,
	}
	cmd := &cobra.Command{
		Use:   "distributor",
		Short: "Run a Sliceplane distributor: stream to each node the changes of its slices",
		Long: `distributor follows the assigner's quanta (the changes of the slice map) and the data
source's changes (in etcd, or a PostgreSQL table with --source postgres, read by logical
replication through a slot named after --id), puts them in causal order, and keeps for each node it serves a
queue of deltas that brings the node's data in line with its slices; nodes pull their
queues over gRPC. Several distributors share the nodes: each registers in etcd under --id
and the assigner spreads the nodes over those registered. A restart is safe: queues live
in memory, so the restarted distributor's nodes catch up by taking a snapshot.

A distributor also relays the map and the node list to routers and members, on the same
address: they watch it rather than the assigner, which streams to the distributors only.

With --target it serves those targets (sharded services of the control plane), each with
its own registration, quanta, nodes and relay, on the one address; a call goes to the
target it names. A target's items are under its etcd data prefix unless --sources gives
its source.

Flags can also come from a YAML file (--config), one flag name per key; flags given
on the command line win.`,
		Example: `  # Next to a zero-setup assigner on the same machine (its embedded etcd and gRPC port).
  distributor

  # Two distributors on one machine.
  distributor --id d1
  distributor --id d2 --listen 127.0.0.1:7082 --metrics-listen 127.0.0.1:7083

  # Against an etcd cluster and two assigners, with mutual TLS on every link.
  distributor --etcd-endpoints https://10.0.0.1:2379,https://10.0.0.2:2379 \
    --assigners 10.0.0.5:7070,10.0.0.6:7070 --listen :7080 --advertise 10.0.0.7:7080 \
    --tls-cert distributor-d1.crt --tls-key distributor-d1.key --tls-ca ca.crt

  # Three targets, one of them on a PostgreSQL table (sources.yaml: counter: {source: postgres, pg-dsn: ...}).
  distributor --id d1 --target default,kv,counter --sources sources.yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.NoArgs(cmd, args); err != nil {
				return usageError(err)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.config != "" {
				if err := flagfile.Load(cmd.Flags(), o.config); err != nil {
					return usageError(err)
				}
			}
			return o.run(cmd.Context())
		},
		SilenceUsage: true,
		// main prints the error once, with the binary's name.
		SilenceErrors: true,
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	f := cmd.Flags()
	f.StringVar(&o.config, "config", "", "YAML file of flag values (keys are flag names)")
	f.StringVar(&o.id, "id", "", "name of this distributor among the others; keep it across restarts (default: the host name)")
	f.StringVar(&o.listen, "listen", "127.0.0.1:7080", "gRPC address to serve nodes on")
	f.StringVar(&o.advertise, "advertise", "", "address nodes should dial to reach this distributor (default: the bound address; set it when --listen is a wildcard)")
	f.StringVar(&o.metrics, "metrics-listen", "127.0.0.1:7081", "address serving Prometheus metrics at /metrics (empty: none)")
	f.StringSliceVar(&o.assigners, "assigners", []string{"127.0.0.1:7070"}, "gRPC addresses of the assigners, leader and standbys")
	f.StringSliceVar(&o.endpoints, "etcd-endpoints", []string{"http://127.0.0.1:2379"}, "endpoints of the etcd cluster the assigner uses; a zero-setup assigner's embedded etcd listens on the default (https:// with TLS)")
	f.StringVar(&o.prefix, "prefix", "/sliceplane/", "etcd key prefix of the cluster's state and data, as given to the assigner")
	f.StringSliceVar(&o.targets, "target", nil, "the targets (sharded services) this distributor serves, comma-separated or repeated (default: the default target); a target's source is its etcd data/ prefix unless --sources gives another")
	f.StringVar(&o.sources, "sources", "", "YAML file of the sources of several targets: each target's name with the source flags below it (source, pg-dsn, pg-table, ...); the flags --source and --pg-* serve one target only")
	f.DurationVar(&o.sessionTTL, "session-ttl", 5*time.Second, "registration lease: how long nodes wait for a dead distributor before they move (whole seconds)")
	f.IntVar(&o.maxDeltaOps, "max-delta-ops", 1024, "most operations in one delta sent to a node")
	f.Var(&o.maxDeltaBytes, "max-delta-bytes", "most bytes of operations in one delta (nodes accept gRPC messages of up to 4MiB)")
	f.Var(&o.maxInFlightBytes, "max-in-flight-bytes", "most bytes sent to a node and not yet acknowledged")
	f.Var(&o.maxQueueBytes, "max-queue-bytes", "most bytes queued for one node; beyond it the queue is dropped and the node takes a snapshot")
	// Kept so that configurations naming it still start: changes no longer wait for quanta.
	f.Var(&o.maxBufferedBytes, "max-buffered-bytes", "no effect")
	_ = f.MarkDeprecated("max-buffered-bytes", "it has no effect: changes no longer wait for quanta")
	f.IntVar(&o.scanWorkers, "scan-workers", 4, "snapshot scans reading the source at once")
	f.Var(&o.maxScanAhead, "max-scan-ahead-bytes", "most bytes of a snapshot held for one node and not yet acknowledged; the scan waits for the node beyond it")
	f.DurationVar(&o.clockInterval, "clock-interval", 50*time.Millisecond, "shortest time between the deltas that only advance a node's clock")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "text or json")
	o.tls.AddFlags(f, true)
	f.StringVar(&o.authzPolicy, "authz-policy", "", "YAML file granting identities roles beyond their kind's (with TLS)")
	o.source.AddFlags(f)
	return cmd
}

// validate checks what only the command knows of, before anything starts, so that a typo
// fails at once with the flag named instead of as a retry loop in the log: the etcd
// endpoints, the zeros distributor.Config would take for its defaults, and the host name as
// the default ID. distributor.Config.Validate checks the rest.
func (o *options) validate() error {
	if o.id == "" {
		h, err := hostname()
		if err != nil {
			return usagef("--id is not set and the host name is unknown (%w); set --id", err)
		}
		if err := membership.ValidateID(h); err != nil {
			return usagef("--id is not set and the host name cannot be the ID (%w); set --id", err)
		}
		o.id = h
	}
	if err := o.source.Validate(); err != nil {
		return usageError(err)
	}
	switch {
	case len(o.endpoints) == 0:
		return usagef("--etcd-endpoints: want at least one endpoint")
	case o.clockInterval <= 0:
		return usagef("--clock-interval %s: want more than 0", o.clockInterval)
	}
	// Zero means "the default" to distributor.Config, which on a command line with the
	// defaults shown would be a surprise: refuse it.
	for _, n := range []struct {
		flag string
		v    int
	}{
		{"max-delta-ops", o.maxDeltaOps}, {"max-delta-bytes", int(o.maxDeltaBytes)},
		{"max-in-flight-bytes", int(o.maxInFlightBytes)}, {"max-queue-bytes", int(o.maxQueueBytes)},
		{"scan-workers", o.scanWorkers},
		{"max-scan-ahead-bytes", int(o.maxScanAhead)},
	} {
		if n.v < 1 {
			return usagef("--%s %d: want at least 1", n.flag, n.v)
		}
	}
	return nil
}

func (o *options) logger() (*slog.Logger, error) {
	log, err := logging.New(os.Stderr, o.logLevel, o.logFormat)
	if err != nil {
		return nil, usageError(err)
	}
	return log, nil
}

func (o *options) run(ctx context.Context) error {
	log, err := o.logger()
	if err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	src, policy, err := o.security()
	if err != nil {
		return err
	}
	cfg := distributor.Config{
		ID: o.id, Listen: o.listen, Advertise: o.advertise, MetricsListen: o.metrics,
		Assigners: o.assigners, Prefix: o.prefix, SessionTTL: o.sessionTTL,
		MaxDeltaOps: o.maxDeltaOps, MaxDeltaBytes: int(o.maxDeltaBytes), MaxInFlightBytes: int(o.maxInFlightBytes),
		MaxQueueBytes: int(o.maxQueueBytes),
		ScanWorkers:   o.scanWorkers, MaxScanAheadBytes: int(o.maxScanAhead), ClockInterval: o.clockInterval,
		TLS: src, Policy: policy, Insecure: o.tls.Insecure, Logger: log,
	}
	closeSources, err := o.lanes(ctx, &cfg, log)
	defer closeSources()
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return usageError(err)
	}
	cfg.Client, err = clientv3.New(clientv3.Config{Endpoints: o.endpoints, DialTimeout: 5 * time.Second, Context: ctx,
		Logger: etcdlog.New(log, zapcore.WarnLevel, nil), TLS: src.ClientTLS()})
	if err != nil {
		return fmt.Errorf("distributor: connecting to etcd %v: %w", o.endpoints, err)
	}
	// Closed after Run, which revokes the registration's lease through it on the way out.
	defer cfg.Client.Close()
	srv, err := distributor.New(cfg)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

// lanes sets the targets of cfg and opens their sources: one target with the source flags,
// read through a slot named after the distributor, as before targets; several with
// --sources, each through a slot of its own. It returns what closes the sources opened.
func (o *options) lanes(ctx context.Context, cfg *distributor.Config, log *slog.Logger) (func(), error) {
	var opened []*postgres.Source
	closeAll := func() {
		for _, pg := range opened {
			pg.Close()
		}
	}
	names, sources, err := o.targetSources()
	if err != nil {
		return closeAll, err
	}
	for _, name := range names {
		opts, slot, llog := sources[target.Name(name)], postgres.SlotName(o.id+"_"+target.Name(name)), log.With("target", target.Name(name))
		if o.sources == "" && len(names) == 1 {
			opts, slot, llog = o.source, postgres.SlotName(o.id), log
		}
		pg, err := opts.Open(ctx, slot, llog, nil) // a slot of its own: a slot is confirmed by its one reader
		if err != nil {
			return closeAll, fmt.Errorf("distributor: target %s: %w", target.Name(name), err)
		}
		l := distributor.Lane{Target: name}
		if pg != nil {
			opened, l.Source = append(opened, pg), pg
		}
		cfg.Lanes = append(cfg.Lanes, l)
	}
	return closeAll, nil
}

// targetSources returns the targets of --target (or, without it, of --sources, or the
// default target) and the sources --sources gives them, refusing a source for a target not
// served and the source flags beside several targets or --sources.
func (o *options) targetSources() ([]string, map[string]sourceflag.Options, error) {
	if o.sources == "" && len(o.targets) <= 1 {
		if len(o.targets) == 0 {
			return []string{""}, nil, nil
		}
		return o.targets, nil, nil
	}
	if o.source.Kind != "" && o.source.Kind != sourceflag.Etcd {
		return nil, nil, usagef("--source %s serves one target; give the sources of several in --sources", o.source.Kind)
	}
	sources := map[string]sourceflag.Options{}
	if o.sources != "" {
		var err error
		if sources, err = sourceflag.LoadTargets(o.sources); err != nil {
			return nil, nil, usagef("--sources: %w", err)
		}
	}
	names := o.targets
	if len(names) == 0 {
		names = slices.Sorted(maps.Keys(sources))
	}
	for name := range sources {
		if !slices.ContainsFunc(names, func(n string) bool { return target.Name(n) == name }) {
			return nil, nil, usagef("--sources %s: target %q is not among --target %s", o.sources, name, strings.Join(o.targets, ","))
		}
	}
	return names, sources, nil
}

// security loads the TLS files and the policy: a partial set of TLS flags, a file that does
// not load or a policy without TLS to authenticate its identities is a usage error.
func (o *options) security() (*mtls.Source, *authz.Policy, error) {
	src, policy, err := authz.LoadServer(o.tls, o.authzPolicy)
	if err != nil {
		return nil, nil, usagef("distributor: %w", err)
	}
	if src != nil && src.Identity().Kind != "distributor" {
		return nil, nil, usagef("--tls-cert names %s; a distributor's certificate must name spiffe://%s/distributor/<id>",
			src.Identity(), mtls.TrustDomain)
	}
	if err := mtls.CheckEndpoints(src, o.endpoints); err != nil {
		return nil, nil, usagef("distributor: %w", err)
	}
	return src, policy, nil
}

// byteSize is a flag of a number of bytes: a whole number, optionally with a binary unit.
type byteSize int

var byteUnits = []struct {
	suffix string
	n      int
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

func (b *byteSize) Set(s string) error {
	num, unit := s, 1
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			num, unit = strings.TrimSpace(rest), u.n
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 63)
	if err != nil || n > uint64(math.MaxInt/unit) {
		return errors.New("want a whole number of bytes, optionally with B, KiB, MiB or GiB, such as 64MiB")
	}
	*b = byteSize(int(n) * unit)
	return nil
}

func (b *byteSize) String() string {
	for _, u := range byteUnits {
		if *b != 0 && int(*b)%u.n == 0 {
			if u.n == 1 {
				break
			}
			return strconv.Itoa(int(*b)/u.n) + u.suffix
		}
	}
	return strconv.Itoa(int(*b))
}

func (b *byteSize) Type() string { return "bytes" }
