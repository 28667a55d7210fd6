// Package kvcluster runs a whole Sliceplane with the example key-value store as separate
// processes on loopback: assigners, distributors and kvnode nodes, built from this module.
// The demo and the end-to-end tests drive it, through the public APIs only.
package kvcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/healthcheck"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// Binaries are the main packages a cluster runs, by binary name.
var Binaries = map[string]string{
	"assigner":    "./cmd/assigner",
	"distributor": "./cmd/distributor",
	"slicectl":    "./cmd/slicectl",
	"kvnode":      "./examples/kvstore/cmd/kvnode",
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
}

// Member is one process of the cluster.
type Member struct {
	// Kind is "assigner", "distributor" or "node"; ID its name.
	Kind, ID string
	// Addr is where it serves (gRPC, or HTTP for nodes); Metrics, its /metrics address.
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

	mu      sync.Mutex
	members []*Member
}

// New prepares a cluster; nothing starts until the Start methods.
func New(opts Options) (*Cluster, error) {
	if opts.Ready == 0 {
		opts.Ready = 30 * time.Second
	}
	logs := filepath.Join(opts.Dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, fmt.Errorf("kvcluster: %w", err)
	}
	return &Cluster{opts: opts, logs: logs}, nil
}

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

// Assigners returns the gRPC addresses of the assigners.
func (c *Cluster) Assigners() []string {
	var out []string
	for _, m := range c.Members("assigner") {
		out = append(out, m.Addr)
	}
	return out
}

// NodeURLs returns the HTTP base URLs of the nodes, by node ID.
func (c *Cluster) NodeURLs() map[string]string {
	out := map[string]string{}
	for _, m := range c.Members("node") {
		out[m.ID] = "http://" + m.Addr
	}
	return out
}

// Nodes returns HTTP clients of the nodes, in ID order.
func (c *Cluster) Nodes() []*kvclient.Node {
	urls := c.NodeURLs()
	var out []*kvclient.Node
	for _, id := range slices.Sorted(maps.Keys(urls)) {
		out = append(out, kvclient.New(urls[id], nil))
	}
	return out
}

// Dial returns a connection that follows the leading assigner; the caller closes it.
func (c *Cluster) Dial() (*grpc.ClientConn, error) { return dial.Leader(c.Assigners()) }

func (c *Cluster) bin(name string) string { return filepath.Join(c.opts.Bin, name) }

func (c *Cluster) etcd() string { return strings.Join(c.opts.Etcd, ",") }

// StartAssigner starts an assigner and waits until it serves (as leader or standby).
func (c *Cluster) StartAssigner(ctx context.Context, id string) (*Member, error) {
	addrs, err := launch.FreeAddrs(2)
	if err != nil {
		return nil, err
	}
	m := &Member{Kind: "assigner", ID: id, Addr: addrs[0], Metrics: addrs[1]}
	m.args = append([]string{"--etcd-endpoints", c.etcd(), "--listen", m.Addr, "--metrics-listen", m.Metrics}, c.opts.AssignerArgs...)
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
	m.args = append([]string{"--id", id, "--etcd-endpoints", c.etcd(), "--assigners", strings.Join(c.Assigners(), ","),
		"--listen", m.Addr, "--metrics-listen", m.Metrics}, c.opts.DistributorArgs...)
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
	m.args = append([]string{"--id", id, "--listen", m.Addr, "--assigners", strings.Join(c.Assigners(), ","),
		"--data-dir", filepath.Join(c.opts.Dir, "nodes", id)}, c.opts.NodeArgs...)
	if err := c.start(ctx, m); err != nil {
		return nil, err
	}
	c.add(m)
	return m, nil
}

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
	bin := map[string]string{"assigner": "assigner", "distributor": "distributor", "node": "kvnode"}[m.Kind]
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
		return serving(ctx, m)
	})
	if err != nil {
		p.Kill()
		return fmt.Errorf("kvcluster: %w\n%s", err, p.Tail(20))
	}
	return nil
}

// serving checks once whether m serves: gRPC health for assigners and distributors, /healthz
// for nodes.
func serving(ctx context.Context, m *Member) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if m.Kind == "node" {
		return healthcheck.HTTP(ctx, "http://"+m.Addr+"/healthz")
	}
	return healthcheck.GRPC(ctx, m.Addr, "")
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

// Stop stops every process, nodes first and assigners last, each within grace; it returns
// the processes that did not stop cleanly.
func (c *Cluster) Stop(grace time.Duration) error {
	var errs []error
	for _, kind := range []string{"node", "distributor", "assigner"} {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, m := range c.Members(kind) {
			p := m.Proc()
			if p == nil {
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
