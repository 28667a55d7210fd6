// Package kvcluster runs a whole Sliceplane with the example key-value store as separate
// processes on loopback: assigners, distributors and kvnode nodes, built from this module.
// A Plane (etcd and assigners) may be shared by the clusters of several targets.
// The demo and the end-to-end tests drive it, through the public APIs only.
package kvcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/healthcheck"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/target"
)

// Binaries are the main packages a cluster runs, by binary name.
var Binaries = map[string]string{
	"assigner":    "./cmd/assigner",
	"distributor": "./cmd/distributor",
	"slicectl":    "./cmd/slicectl",
	"kvnode":      "./examples/kvstore/cmd/kvnode",
	// countermember, a member of the example counter (StartCounter).
	"countermember": "./examples/counter/cmd/countermember",
	// ratelimitmember, a member of the example rate limiter (StartRateLimiter).
	"ratelimitmember": "./examples/ratelimit/cmd/ratelimitmember",
}

// Options shape a cluster.
type Options struct {
	// Bin is the directory holding the binaries named in Binaries.
	Bin string
	// Dir holds the logs (Dir/logs) and the nodes' data (Dir/nodes).
	Dir string
	// Etcd are the endpoints of the etcd cluster every part uses.
	Etcd []string
	// Extra flags of each kind of process.
	AssignerArgs, DistributorArgs, NodeArgs []string
	// Ready bounds the wait for a started process to serve; default 30 s.
	Ready time.Duration
	// DrainTimeout, when set, makes nodes drain on SIGTERM for up to that long (kvnode's
	// --drain-timeout): Roll restarts a node without a failed read, and Stop stops the nodes
	// one after another, each draining onto those still up. Zero stops nodes at once.
	DrainTimeout time.Duration
	// PKI, when set, gives every process a certificate of its identity (assigner/ID,
	// distributor/ID, node/ID) and the cluster's own clients an admin's (admin/kvcluster):
	// every link is mutual TLS. Nil runs everything plaintext on loopback.
	PKI *launch.PKI
	// Plane, when set, is a control plane started elsewhere that the cluster's processes
	// use, beside any assigner it starts: its etcd and PKI replace Etcd and PKI.
	Plane *Plane
	// Target is the target the cluster's distributors, nodes and counter members belong to,
	// each with a certificate confined to it; "" for the default target.
	Target string
}

// Member is one process of the cluster.
type Member struct {
	// Kind is "assigner", "distributor", "node", "counter" or "ratelimit"; ID its name.
	Kind, ID string
	// Addr is where it serves (gRPC, or HTTP for nodes and counter members); Metrics, its
	// /metrics address.
	Addr, Metrics string

	args []string
	mu   sync.Mutex
	proc *launch.Proc
}

// Proc returns the member's current process.
func (m *Member) Proc() *launch.Proc {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc
}

// Cluster is a running set of processes.
type Cluster struct {
	opts Options
	logs string
	// tls is the cluster's own identity (nil: plaintext), for Dial, Nodes and the probes.
	tls *mtls.Source
	// http is the client of the nodes' HTTP APIs.
	http *http.Client

	mu      sync.Mutex
	members []*Member
}

// New prepares a cluster; nothing starts until the Start methods.
func New(opts Options) (*Cluster, error) {
	if opts.Ready == 0 {
		opts.Ready = 30 * time.Second
	}
	if opts.Plane != nil {
		opts.Etcd, opts.PKI = opts.Plane.Etcd(), opts.Plane.PKI
	}
	if target.Name(opts.Target) == target.Default {
		opts.Target = "" // a default target's identities name none, as before targets
	}
	logs := filepath.Join(opts.Dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, fmt.Errorf("kvcluster: %w", err)
	}
	src, err := opts.PKI.Source("admin", AdminName)
	if err != nil {
		return nil, fmt.Errorf("kvcluster: %w", err)
	}
	return &Cluster{opts: opts, logs: logs, tls: src, http: kvclient.HTTPClient(src, 30*time.Second)}, nil
}

// AdminName is the name of the cluster's own identity, spiffe://sliceplane/admin/kvcluster.
const AdminName = "kvcluster"

// TLS returns the cluster's own identity, an admin's; nil when the cluster runs plaintext.
func (c *Cluster) TLS() *mtls.Source { return c.tls }

// HTTPClient returns the client of the nodes' HTTP APIs, with the cluster's certificate.
func (c *Cluster) HTTPClient() *http.Client { return c.http }

// LogDir returns the directory of the processes' logs.
func (c *Cluster) LogDir() string { return c.logs }

func (c *Cluster) add(m *Member) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.members = append(c.members, m)
}

// Members returns the members of a kind ("" for all), in the order they were added.
func (c *Cluster) Members(kind string) []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Member
	for _, m := range c.members {
		if kind == "" || m.Kind == kind {
			out = append(out, m)
		}
	}
	return out
}

// Member returns the member of a kind with an ID.
func (c *Cluster) Member(kind, id string) (*Member, bool) {
	for _, m := range c.Members(kind) {
		if m.ID == id {
			return m, true
		}
	}
	return nil, false
}

// Assigners returns the gRPC addresses of the assigners: the plane's, then the cluster's.
func (c *Cluster) Assigners() []string {
	var plane []*Member
	if c.opts.Plane != nil {
		plane = c.opts.Plane.Assigners()
	}
	return Addrs(append(plane, c.Members("assigner")...))
}

// Addrs returns the addresses of ms.
func Addrs(ms []*Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Addr)
	}
	return out
}

// NodeURLs returns the base URLs of the nodes' HTTP APIs (https with a PKI), by node ID.
func (c *Cluster) NodeURLs() map[string]string {
	out := map[string]string{}
	for _, m := range c.Members("node") {
		out[m.ID] = kvclient.Scheme(c.http) + "://" + m.Addr
	}
	return out
}

// Nodes returns HTTP clients of the nodes, in ID order.
func (c *Cluster) Nodes() []*kvclient.Node {
	urls := c.NodeURLs()
	var out []*kvclient.Node
	for _, id := range slices.Sorted(maps.Keys(urls)) {
		out = append(out, kvclient.New(urls[id], c.http))
	}
	return out
}

// Dial returns a connection that follows the assigner leading the cluster's target, as the
// cluster's admin; the caller closes it.
func (c *Cluster) Dial() (*grpc.ClientConn, error) {
	return dial.TargetLeader(c.opts.Target, c.Assigners(), c.tls.DialOption("assigner"))
}

// memberArgs issues the certificate of kind/id, confined to the cluster's target, and
// returns its flags and the target's.
func (c *Cluster) memberArgs(kind, id string) ([]string, error) {
	args, err := c.opts.PKI.ArgsOf(certs.Request{Target: c.opts.Target, Kind: kind, Name: id})
	if err != nil {
		return nil, err
	}
	if c.opts.Target != "" {
		args = append(args, "--target", c.opts.Target)
	}
	return args, nil
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.opts.Bin, name) }

func (c *Cluster) etcd() string { return strings.Join(c.opts.Etcd, ",") }

// StartAssigner starts an assigner and waits until it serves (as leader or standby).
func (c *Cluster) StartAssigner(ctx context.Context, id string) (*Member, error) {
	addrs, err := launch.FreeAddrs(2)
	if err != nil {
		return nil, err
	}
	m := &Member{Kind: "assigner", ID: id, Addr: addrs[0], Metrics: addrs[1]}
	tls, err := c.opts.PKI.Args("assigner", id)
	if err != nil {
		return nil, err
	}
	m.args = append([]string{"--etcd-endpoints", c.etcd(), "--listen", m.Addr, "--metrics-listen", m.Metrics}, tls...)
	m.args = append(m.args, c.opts.AssignerArgs...)
	if err := c.start(ctx, m); err != nil {
		return nil, err
	}
	c.add(m)
	return m, nil
}

// StartDistributor starts a distributor and waits until it serves.
func (c *Cluster) StartDistributor(ctx context.Context, id string) (*Member, error) {
	addrs, err := launch.FreeAddrs(2)
	if err != nil {
		return nil, err
	}
	m := &Member{Kind: "distributor", ID: id, Addr: addrs[0], Metrics: addrs[1]}
	tls, err := c.memberArgs("distributor", id)
	if err != nil {
		return nil, err
	}
	m.args = append([]string{"--id", id, "--etcd-endpoints", c.etcd(), "--assigners", strings.Join(c.Assigners(), ","),
		"--listen", m.Addr, "--metrics-listen", m.Metrics}, tls...)
	m.args = append(m.args, c.opts.DistributorArgs...)
	if err := c.start(ctx, m); err != nil {
		return nil, err
	}
	c.add(m)
	return m, nil
}

// StartNode starts a kvnode with its data in Dir/nodes/id and waits until it serves.
func (c *Cluster) StartNode(ctx context.Context, id string) (*Member, error) {
	addrs, err := launch.FreeAddrs(1)
	if err != nil {
		return nil, err
	}
	m := &Member{Kind: "node", ID: id, Addr: addrs[0], Metrics: addrs[0]}
	tls, err := c.memberArgs("node", id)
	if err != nil {
		return nil, err
	}
	m.args = append([]string{"--id", id, "--listen", m.Addr, "--assigners", strings.Join(c.Assigners(), ","),
		"--data-dir", filepath.Join(c.opts.Dir, "nodes", id), "--drain-timeout", c.opts.DrainTimeout.String()}, tls...)
	m.args = append(m.args, c.opts.NodeArgs...)
	if err := c.start(ctx, m); err != nil {
		return nil, err
	}
	c.add(m)
	return m, nil
}

// StartCounter starts a member of the example counter (countermember) with its counts in
// the PostgreSQL database dsn, and waits until it serves. Its kind is "counter"; it drains
// on SIGTERM for Options.DrainTimeout, as a node does.
func (c *Cluster) StartCounter(ctx context.Context, id, dsn string, extra ...string) (*Member, error) {
	addrs, err := launch.FreeAddrs(1)
	if err != nil {
		return nil, err
	}
	m := &Member{Kind: "counter", ID: id, Addr: addrs[0], Metrics: addrs[0]}
	tls, err := c.memberArgs("node", id) // a member's identity is a node's
	if err != nil {
		return nil, err
	}
	m.args = append([]string{"--id", id, "--listen", m.Addr, "--assigners", strings.Join(c.Assigners(), ","),
		"--pg-dsn", dsn, "--drain-timeout", c.opts.DrainTimeout.String()}, tls...)
	m.args = append(m.args, extra...)
	if err := c.start(ctx, m); err != nil {
		return nil, err
	}
	c.add(m)
	return m, nil
}

// StartRateLimiter starts a member of the example rate limiter (ratelimitmember) and waits
// until its gRPC health service says it serves. Its kind is "ratelimit"; it drains on
// SIGTERM for Options.DrainTimeout, as a node does. The assigners must run with the role
// model it is given (--roles, primary-secondary by default).
func (c *Cluster) StartRateLimiter(ctx context.Context, id string, extra ...string) (*Member, error) {
	if c.opts.Target != "" {
		return nil, fmt.Errorf("kvcluster: a rate limiter member serves the default target only, not %q", c.opts.Target)
	}
	addrs, err := launch.FreeAddrs(1)
	if err != nil {
		return nil, err
	}
	m := &Member{Kind: "ratelimit", ID: id, Addr: addrs[0], Metrics: addrs[0]}
	tls, err := c.opts.PKI.Args("node", id) // a member's identity is a node's
	if err != nil {
		return nil, err
	}
	m.args = append([]string{"--id", id, "--listen", m.Addr, "--assigners", strings.Join(c.Assigners(), ","),
		"--drain-timeout", c.opts.DrainTimeout.String()}, tls...)
	m.args = append(m.args, extra...)
	if err := c.start(ctx, m); err != nil {
		return nil, err
	}
	c.add(m)
	return m, nil
}

// Roll restarts node m as an orchestrator's rolling restart does: SIGTERM, which with
// Options.DrainTimeout hands its slices off before it exits, then the same node again, with
// its data, once it serves.
func (c *Cluster) Roll(ctx context.Context, m *Member) error {
	if p := m.Proc(); p != nil {
		if err := p.Stop(c.opts.DrainTimeout + stopGrace); err != nil {
			return fmt.Errorf("kvcluster: rolling %s: %w", m.ID, err)
		}
	}
	return c.Restart(ctx, m)
}

// stopGrace is how long a node may take to stop beyond its drain.
const stopGrace = 10 * time.Second

// Restart starts a stopped or killed member again, with the same flags, addresses and data.
func (c *Cluster) Restart(ctx context.Context, m *Member) error {
	if p := m.Proc(); p != nil {
		select {
		case <-p.Done():
		default:
			return fmt.Errorf("kvcluster: %s %s is still running", m.Kind, m.ID)
		}
	}
	return c.start(ctx, m)
}

// start starts m's process and waits until it serves, or the process exits, or Ready passes.
func (c *Cluster) start(ctx context.Context, m *Member) error {
	bin := map[string]string{"assigner": "assigner", "distributor": "distributor", "node": "kvnode", "counter": "countermember",
		"ratelimit": "ratelimitmember"}[m.Kind]
	p, err := launch.Start(m.Kind+"-"+m.ID, c.bin(bin), m.args, c.logs)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.proc = p
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, c.opts.Ready)
	defer cancel()
	err = launch.WaitFor(ctx, m.Kind+" "+m.ID+" to serve", 50*time.Millisecond, func(ctx context.Context) error {
		if done, err := p.Exited(); done {
			return launch.Permanent(err)
		}
		return c.serving(ctx, m)
	})
	if err != nil {
		p.Kill()
		return fmt.Errorf("kvcluster: %w\n%s", err, p.Tail(20))
	}
	return nil
}

// serving checks once whether m serves: gRPC health for assigners, distributors and rate
// limiter members, /healthz for nodes and counter members; with the cluster's certificate
// when it runs with a PKI.
func (c *Cluster) serving(ctx context.Context, m *Member) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if m.Kind == "node" || m.Kind == "counter" {
		if c.tls == nil {
			return healthcheck.HTTP(ctx, "http://"+m.Addr+"/healthz")
		}
		return httpHealth(ctx, c.http, "https://"+m.Addr+"/healthz")
	}
	if c.tls == nil {
		return healthcheck.GRPC(ctx, m.Addr, "")
	}
	kind := m.Kind
	if kind == "ratelimit" { // a member's certificate names a node
		kind = "node"
	}
	return grpcHealth(ctx, m.Addr, c.tls.DialOption(kind))
}

// httpHealth reports whether a GET of url with hc answers with a 2xx status.
func httpHealth(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("kvcluster: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("kvcluster: %w", err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) //nolint:errcheck // lets the connection be reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("kvcluster: %s: %s", url, resp.Status)
	}
	return nil
}

// grpcHealth reports whether the gRPC server at addr says it is SERVING.
func grpcHealth(ctx context.Context, addr string, creds grpc.DialOption) error {
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		return fmt.Errorf("kvcluster: %w", err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("kvcluster: %w", err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("kvcluster: %s is %s", addr, st)
	}
	return nil
}

// Exited returns the error of every member whose process exited without being asked to.
func (c *Cluster) Exited() error {
	var errs []error
	for _, m := range c.Members("") {
		if p := m.Proc(); p != nil {
			if _, err := p.Exited(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Stop stops every process, members of the examples and nodes first and assigners last, each
// within grace (and a draining member or node within its drain too); it returns the
// processes that did not stop cleanly.
// Nodes that drain stop one after another: stopped together, each would wait for a node to
// hand its slices to, and find none.
func (c *Cluster) Stop(grace time.Duration) error {
	var errs []error
	for _, kind := range []string{"counter", "ratelimit", "node", "distributor", "assigner"} {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, m := range c.Members(kind) {
			p := m.Proc()
			if p == nil {
				continue
			}
			if (kind == "node" || kind == "counter" || kind == "ratelimit") && c.opts.DrainTimeout > 0 {
				if err := p.Stop(c.opts.DrainTimeout + grace); err != nil {
					errs = append(errs, err)
				}
				continue
			}
			wg.Go(func() {
				if err := p.Stop(grace); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	return errors.Join(errs...)
}
