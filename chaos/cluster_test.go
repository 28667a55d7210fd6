package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/faultproxy"
	"github.com/sliceplane/sliceplane/internal/healthcheck"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// member is one process of the cluster: an etcd member, an assigner, a distributor, a node
// or a member of the example counter.
type member struct {
	kind, id string
	// target is the target a distributor or node serves: "" for the default target.
	target string
	// addr is where it serves, unproxied: etcd's client URL host, gRPC, or a node's HTTP;
	// metrics, an assigner's or distributor's /metrics.
	addr    string
	metrics string
	bin     string
	args    []string
	dataDir string

	mu     sync.Mutex
	proc   *launch.Proc
	frozen bool // SIGSTOPped
}

func (m *member) name() string { return m.kind + "-" + m.id }

func (m *member) current() *launch.Proc {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc
}

// kill sends SIGKILL (after SIGCONT, so that a stopped process dies at once) and waits.
func (m *member) kill() {
	m.cont()
	if p := m.current(); p != nil {
		p.Kill()
	}
}

func (m *member) stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := syscall.Kill(m.proc.Pid(), syscall.SIGSTOP); err != nil {
		return fmt.Errorf("chaos: SIGSTOP %s: %w", m.name(), err)
	}
	m.frozen = true
	return nil
}

func (m *member) cont() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.frozen && m.proc != nil {
		syscall.Kill(m.proc.Pid(), syscall.SIGCONT) //nolint:errcheck // it may have exited
	}
	m.frozen = false
}

func (m *member) isFrozen() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.frozen
}

// alive reports whether the current process runs (it may be stopped).
func (m *member) alive() bool {
	p := m.current()
	if p == nil {
		return false
	}
	done, _ := p.Exited()
	return !done
}

// cluster is the system under test: three etcd members, assigners, distributors and nodes,
// with fault proxies on the links the faults break.
type cluster struct {
	dir, logs, bin string
	ready          time.Duration
	// assignerTTL is the assigners' leader lease (--session-ttl).
	assignerTTL time.Duration
	// sourceArgs are the assigners' and distributors' flags of the source: none for the
	// etcd prefix, the PostgreSQL source's otherwise.
	sourceArgs []string
	// assignerArgs are the assigners' flags of a run, after the suite's (the last of a flag
	// given twice wins): the counter run's roles, leases and handoff timeout.
	assignerArgs []string

	toxi    *toxiproxy.ApiServer
	proxies map[string]*toxiproxy.Proxy
	// holds are the proxies in front of each distributor's toxiproxy, by distributor ID.
	holds map[string]*faultproxy.Proxy

	etcd         []*member
	assigners    []*member
	distributors []*member
	nodes        []*member
	// tenants are the distributors and nodes of the targets beside the default one, by target.
	tenants map[string][]*member
	// counters are the members of the example counter (TestChaosCounter).
	counters []*member

	// etcdCli reaches every etcd member directly, for the writer, the checker and the faults.
	etcdCli *clientv3.Client

	// pki gives every process, etcd members included, its certificate: every link is mutual
	// TLS (through the proxies, which see only TCP). tls is the suite's own identity, an
	// admin's, and http its client of the nodes.
	pki  *launch.PKI
	tls  *mtls.Source
	http *http.Client
}

func newCluster(dir, bin string, assignerTTL time.Duration) (*cluster, error) {
	logs := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	pki, err := launch.NewPKI(filepath.Join(dir, "pki"), 0)
	if err != nil {
		return nil, err
	}
	src, err := pki.Source("admin", "chaos")
	if err != nil {
		return nil, err
	}
	metrics := toxiproxy.NewMetricsContainer(prometheus.NewRegistry())
	return &cluster{dir: dir, logs: logs, bin: bin, ready: 60 * time.Second, assignerTTL: assignerTTL,
		toxi: toxiproxy.NewServer(metrics, zerolog.Nop()), proxies: map[string]*toxiproxy.Proxy{},
		holds: map[string]*faultproxy.Proxy{}, tenants: map[string][]*member{}, pki: pki, tls: src, http: kvclient.HTTPClient(src, 10*time.Second)}, nil
}

// tlsArgs returns the TLS flags of member kind/id of target tgt ("" the default target,
// whose identities name none).
func (c *cluster) tlsArgs(tgt, kind, id string) ([]string, error) {
	return c.pki.ArgsOf(certs.Request{Target: tgt, Kind: kind, Name: id})
}

func (c *cluster) all() []*member {
	var out []*member
	for _, ms := range [][]*member{c.etcd, c.assigners, c.distributors, c.nodes, c.counters} {
		out = append(out, ms...)
	}
	for _, t := range slices.Sorted(maps.Keys(c.tenants)) {
		out = append(out, c.tenants[t]...)
	}
	return out
}

// proxy starts a fault proxy in front of upstream and returns its address.
func (c *cluster) proxy(name, upstream string) (string, error) {
	p := toxiproxy.NewProxy(c.toxi, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return "", fmt.Errorf("chaos: proxy %s: %w", name, err)
	}
	c.proxies[name] = p
	return p.Listen, nil
}

func (c *cluster) etcdEndpoints() []string {
	var out []string
	for _, m := range c.etcd {
		out = append(out, "https://"+m.addr)
	}
	return out
}

// startEtcd starts a cluster of n members and waits until each reports healthy.
func (c *cluster) startEtcd(ctx context.Context, n int) error {
	var initial []string
	for i := range n {
		addrs, err := launch.FreeAddrs(2)
		if err != nil {
			return err
		}
		m := &member{kind: "etcd", id: fmt.Sprintf("e%d", i+1), addr: addrs[0], bin: filepath.Join(c.bin, "etcd")}
		m.dataDir = filepath.Join(c.dir, "etcd", m.id)
		// Clients and peers alike need a certificate of the CA.
		own, err := c.pki.Issue("etcd", m.id)
		if err != nil {
			return err
		}
		m.args = []string{"--name", m.id, "--data-dir", m.dataDir,
			"--listen-client-urls", "https://" + addrs[0], "--advertise-client-urls", "https://" + addrs[0],
			"--listen-peer-urls", "https://" + addrs[1], "--initial-advertise-peer-urls", "https://" + addrs[1],
			"--initial-cluster-token", "chaos", "--initial-cluster-state", "new",
			"--cert-file", own.Cert, "--key-file", own.Key, "--trusted-ca-file", own.CA, "--client-cert-auth",
			"--peer-cert-file", own.Cert, "--peer-key-file", own.Key, "--peer-trusted-ca-file", own.CA, "--peer-client-cert-auth",
			"--log-level", "warn"}
		initial = append(initial, m.id+"=https://"+addrs[1])
		c.etcd = append(c.etcd, m)
	}
	for _, m := range c.etcd {
		m.args = append(m.args, "--initial-cluster", strings.Join(initial, ","))
		if err := c.launch(m); err != nil {
			return err
		}
	}
	for _, m := range c.etcd {
		if err := c.waitServing(ctx, m); err != nil {
			return err
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.etcdEndpoints(), DialTimeout: 5 * time.Second, TLS: c.tls.ClientTLS(),
		Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("chaos: etcd client: %w", err)
	}
	c.etcdCli = cli
	return nil
}

// opts are the flags of the control plane's processes: short leases, so that faults resolve
// in seconds.
var (
	assignerFlags    = []string{"--pass-interval", "200ms", "--node-ttl", "30s"}
	distributorFlags = []string{"--session-ttl", "2s"}
	nodeFlags        = []string{"--report-interval", "200ms"}
)

// etcdProxies starts, for process id, a fault proxy of each etcd member ("etcd-<id>-<member>"),
// and returns the endpoints that dial them.
func (c *cluster) etcdProxies(id string) ([]string, error) {
	var endpoints []string
	for _, e := range c.etcd {
		p, err := c.proxy("etcd-"+id+"-"+e.id, e.addr)
		if err != nil {
			return nil, err
		}
		endpoints = append(endpoints, "https://"+p)
	}
	return endpoints, nil
}

// startAssigner starts an assigner whose etcd client dials its own proxy of each member.
func (c *cluster) startAssigner(ctx context.Context, id string) error {
	addrs, err := launch.FreeAddrs(2)
	if err != nil {
		return err
	}
	endpoints, err := c.etcdProxies(id)
	if err != nil {
		return err
	}
	// Nodes reach the assigner through a proxy of their own; distributors, directly.
	if _, err := c.proxy("assigner-"+id, addrs[0]); err != nil {
		return err
	}
	m := &member{kind: "assigner", id: id, addr: addrs[0], metrics: addrs[1], bin: filepath.Join(c.bin, "assigner")}
	tls, err := c.tlsArgs("", "assigner", id)
	if err != nil {
		return err
	}
	m.args = append([]string{"--etcd-endpoints", strings.Join(endpoints, ","), "--listen", m.addr,
		"--metrics-listen", addrs[1], "--session-ttl", c.assignerTTL.String()}, tls...)
	m.args = append(append(append(m.args, assignerFlags...), c.sourceArgs...), c.assignerArgs...)
	c.assigners = append(c.assigners, m)
	return c.start(ctx, m)
}

func (c *cluster) assignerAddrs() []string {
	var out []string
	for _, m := range c.assigners {
		out = append(out, m.addr)
	}
	return out
}

// startDistributor starts a distributor of target tgt ("" the default target) that
// advertises its proxy to nodes. A distributor of another target reads that target's etcd
// data prefix whatever the run's source.
func (c *cluster) startDistributor(ctx context.Context, tgt, id string) error {
	addrs, err := launch.FreeAddrs(2)
	if err != nil {
		return err
	}
	// Nodes dial a fault proxy (it can stall the streams open at one moment), which dials
	// the toxiproxy in front of the distributor.
	toxic, err := c.proxy("distributor-"+id, addrs[0])
	if err != nil {
		return err
	}
	hold, err := faultproxy.New(toxic)
	if err != nil {
		return err
	}
	c.holds[id] = hold
	adv := hold.Addr()
	// Its etcd, the source's as well as its registration's, through proxies of its own too.
	endpoints, err := c.etcdProxies(id)
	if err != nil {
		return err
	}
	m := &member{kind: "distributor", id: id, target: tgt, addr: addrs[0], metrics: addrs[1], bin: filepath.Join(c.bin, "distributor")}
	tls, err := c.tlsArgs("", "distributor", id)
	if err != nil {
		return err
	}
	m.args = append([]string{"--id", id, "--etcd-endpoints", strings.Join(endpoints, ","),
		"--assigners", strings.Join(c.assignerAddrs(), ","), "--listen", m.addr, "--advertise", adv,
		"--metrics-listen", addrs[1]}, tls...)
	m.args = append(m.args, distributorFlags...)
	if tgt == "" {
		m.args = append(m.args, c.sourceArgs...)
	} else {
		m.args = append(m.args, "--target", tgt)
	}
	c.add(m)
	return c.start(ctx, m)
}

// add counts m among the cluster's distributors or nodes, or its target's tenants.
func (c *cluster) add(m *member) {
	switch {
	case m.target != "":
		c.tenants[m.target] = append(c.tenants[m.target], m)
	case m.kind == "distributor":
		c.distributors = append(c.distributors, m)
	default:
		c.nodes = append(c.nodes, m)
	}
}

// startNode starts a kvnode of target tgt ("" the default target) that reaches the
// assigners through their proxies (one per assigner, shared by the nodes).
func (c *cluster) startNode(ctx context.Context, tgt, id string) error {
	addrs, err := launch.FreeAddrs(1)
	if err != nil {
		return err
	}
	var assigners []string
	for _, a := range c.assigners {
		assigners = append(assigners, c.proxies["assigner-"+a.id].Listen)
	}
	m := &member{kind: "node", id: id, target: tgt, addr: addrs[0], bin: filepath.Join(c.bin, "kvnode"),
		dataDir: filepath.Join(c.dir, "nodes", tgt, id)}
	tls, err := c.tlsArgs(tgt, "node", id)
	if err != nil {
		return err
	}
	m.args = append([]string{"--id", id, "--listen", m.addr, "--assigners", strings.Join(assigners, ","),
		"--data-dir", m.dataDir, "--target", tgt}, tls...)
	m.args = append(m.args, nodeFlags...)
	c.add(m)
	return c.start(ctx, m)
}

func (c *cluster) launch(m *member) error {
	p, err := launch.Start(m.name(), m.bin, m.args, c.logs)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.proc, m.frozen = p, false
	m.mu.Unlock()
	return nil
}

// start starts m's process and waits until it serves.
func (c *cluster) start(ctx context.Context, m *member) error {
	if err := c.launch(m); err != nil {
		return err
	}
	return c.waitServing(ctx, m)
}

// restart starts a killed member again, with the same flags, addresses and data.
func (c *cluster) restart(ctx context.Context, m *member) error {
	if m.alive() {
		return fmt.Errorf("chaos: %s is still running", m.name())
	}
	return c.start(ctx, m)
}

func (c *cluster) waitServing(ctx context.Context, m *member) error {
	p := m.current()
	ctx, cancel := context.WithTimeout(ctx, c.ready)
	defer cancel()
	err := launch.WaitFor(ctx, m.name()+" to serve", 50*time.Millisecond, func(ctx context.Context) error {
		if done, err := p.Exited(); done {
			return launch.Permanent(err)
		}
		return c.serving(ctx, m)
	})
	if err != nil {
		p.Kill()
		return fmt.Errorf("chaos: %w\n%s", err, p.Tail(20))
	}
	return nil
}

// serving checks once whether m serves: /health for etcd, the state of nodes, /healthz for
// counter members, gRPC health for the rest (over mutual TLS, with the suite's certificate).
func (c *cluster) serving(ctx context.Context, m *member) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	switch m.kind {
	case "etcd":
		return healthcheck.HTTPTLS(ctx, "https://"+m.addr+"/health", c.tls.ClientTLS())
	case "node":
		_, err := kvclient.New(m.addr, c.http).State(ctx)
		return err
	case "counter":
		return healthcheck.HTTPTLS(ctx, "https://"+m.addr+"/healthz", c.tls.ClientTLS("node"))
	}
	conn, err := grpc.NewClient(m.addr, c.tls.DialOption(m.kind))
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("chaos: %s: %w", m.name(), err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("chaos: %s is %s", m.name(), resp.GetStatus())
	}
	return nil
}

// exited returns the error of every member whose process exited without being asked to.
func (c *cluster) exited() error {
	var errs []error
	for _, m := range c.all() {
		if p := m.current(); p != nil {
			if _, err := p.Exited(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// scanLogs returns the log files holding a panic or a race report.
func (c *cluster) scanLogs() error {
	files, err := filepath.Glob(filepath.Join(c.logs, "*.log"))
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		for _, bad := range []string{"panic:", "DATA RACE"} {
			if n := strings.Count(string(b), bad); n > 0 {
				errs = append(errs, fmt.Errorf("%s: %d × %q", filepath.Base(f), n, bad))
			}
		}
	}
	return errors.Join(errs...)
}

// close kills every process and stops every proxy.
func (c *cluster) close() {
	var wg sync.WaitGroup
	for _, m := range c.all() {
		wg.Go(m.kill)
	}
	wg.Wait()
	for _, h := range c.holds {
		h.Close() //nolint:errcheck // the test is ending; its listener's error says nothing
	}
	for _, p := range c.proxies {
		p.Stop()
	}
	if c.etcdCli != nil {
		c.etcdCli.Close()
	}
}

// etcdLeader returns the etcd member that leads, asking each live member.
func (c *cluster) etcdLeader(ctx context.Context) (*member, error) {
	for _, m := range c.etcd {
		if !m.alive() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.etcdCli.Status(sctx, "https://"+m.addr)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.GetMemberId() {
			return m, nil
		}
	}
	return nil, errors.New("chaos: no etcd member leads")
}
