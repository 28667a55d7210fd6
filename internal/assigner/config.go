package assigner

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/grpcserver"
	"github.com/sliceplane/sliceplane/internal/heatmap"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/target/registry"
)

// Config configures a Server.
type Config struct {
	// Listen is the gRPC address, "127.0.0.1:0" for a free port. Advertise is the address
	// others should dial, told to clients by standbys; default the bound address.
	Listen, Advertise string
	// MetricsListen serves Prometheus metrics at /metrics; "" serves none.
	MetricsListen string
	// Client reaches the etcd cluster that holds the state and the data source. Required.
	Client *clientv3.Client
	// Prefix roots the assigner's keys in etcd: state under Prefix+"assigner/", the
	// election under Prefix+"election/". Default "/sliceplane/".
	Prefix string
	// SourcePrefix is where the data source keeps its items; default Prefix+"data/".
	SourcePrefix string
	// Source is the data source whose clock stamps the quanta; default the etcd prefix
	// SourcePrefix. The leader follows only its clock (Watch's progress marks).
	Source source.Source
	// PassInterval is the time between balancing passes; default 1 s.
	PassInterval time.Duration
	// ClockInterval is the shortest time between clock-only quanta; default 20 ms.
	ClockInterval time.Duration
	// SessionTTL is the leader's etcd lease: how long a standby waits for a dead leader.
	// Default 5 s.
	SessionTTL time.Duration
	// MaxRequestBytes caps a request; default 16 MiB.
	MaxRequestBytes int
	// MaxReportsPerSecond is how many load reports a member may send a second, in every
	// target (--max-reports-per-second); the rest are dropped at the API, before its target's
	// leader loop (reportGate). 0: DefaultReportsPerSecond; negative: no limit.
	MaxReportsPerSecond float64
	// HeavySlices is the size from which a target is heavy: its owner leads it alone
	// (target.Place; --heavy-target-slices). 0: target.HeavySlices. Give every assigner the
	// same.
	HeavySlices int64
	// Core configures the balancing state.
	Core core.Config
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// Registry receives the metrics; default a new registry.
	Registry *prometheus.Registry
	// TLS secures the gRPC and metrics endpoints with mutual TLS; nil serves plaintext, which
	// only loopback addresses accept unless Insecure is set (closed by default).
	TLS *mtls.Source
	// Policy grants identities roles beyond their kind's; nil grants none.
	Policy *authz.Policy
	// Insecure lets the server listen without TLS on a non-loopback address.
	Insecure bool
	// History bounds the web view's heatmap (package heatmap): by default an hour of passes
	// at PassInterval. HistoryFlush is how often the leader persists it; default 10 s.
	History      heatmap.Config
	HistoryFlush time.Duration
	// Targets are declared in a file (--targets): the assigner creates or updates each in
	// the registry when it starts, so that a repository can hold them. The default target is
	// configured by the fields above, and always served.
	Targets []registry.Record

	// rawCore is Core as given, before Validate filled it in: a target's config applies to it.
	rawCore *core.Config
}

// Validate fills in the defaults of c and rejects a configuration no assigner can run with,
// plaintext off loopback included (closed by default); New calls it. It leaves Client to New,
// so that a command can check its settings before it starts or reaches etcd.
func (c *Config) Validate() error {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.Prefix == "" {
		c.Prefix = "/sliceplane/"
	}
	if c.SourcePrefix == "" {
		c.SourcePrefix = target.DataPrefix(c.Prefix, target.Default)
	}
	if err := grpcserver.FillDefaults("assigner",
		grpcserver.Default("--pass-interval", &c.PassInterval, time.Second),
		grpcserver.Default("--clock-interval", &c.ClockInterval, 20*time.Millisecond),
		grpcserver.Default("--session-ttl", &c.SessionTTL, 5*time.Second),
		grpcserver.Default("HistoryFlush", &c.HistoryFlush, 10*time.Second),
	); err != nil {
		return err
	}
	if c.SessionTTL < time.Second {
		return fmt.Errorf("assigner: --session-ttl %s: etcd leases last whole seconds, at least 1 s", c.SessionTTL)
	}
	if err := grpcserver.FillDefaults("assigner", grpcserver.Default("MaxRequestBytes", &c.MaxRequestBytes, 16<<20)); err != nil {
		return err
	}
	if c.HeavySlices == 0 {
		c.HeavySlices = target.HeavySlices
	}
	if c.HeavySlices < 0 {
		return fmt.Errorf("assigner: --heavy-target-slices %d: want at least 1", c.HeavySlices)
	}
	if c.MaxReportsPerSecond == 0 {
		c.MaxReportsPerSecond = DefaultReportsPerSecond
	}
	if c.rawCore == nil {
		raw := c.Core
		c.rawCore = &raw
	}
	base := *c.rawCore
	if err := fillCore(&c.Core); err != nil {
		return err
	}
	for _, t := range c.Targets {
		if err := target.CheckName(t.Name); err != nil {
			return fmt.Errorf("assigner: --targets: %w", err)
		}
		if _, err := t.Config.Apply(base); err != nil {
			return fmt.Errorf("assigner: --targets: target %s: %w", t.Name, err)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.History.Columns == 0 {
		c.History.Columns = max(int(time.Hour/c.PassInterval), 2)
	}
	return grpcserver.CheckListen("assigner", c.TLS, c.Insecure, c.Listen, c.MetricsListen)
}

// fillCore fills in the defaults of a target's core config and checks it.
func fillCore(c *core.Config) error {
	if c.Algorithm == "" {
		c.Algorithm = "weighted-move"
	}
	if c.LoadWarmUp == 0 {
		c.LoadWarmUp = 2 * time.Second // nodes report every second by default
	}
	if err := c.Fill(); err != nil {
		return err
	}
	_, err := core.NewAlgorithm(c.Algorithm, c.Params)
	return err
}
