package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// outcome is what a fault measured while it ran.
type outcome struct {
	target string
	// takeover is the time from the fault to another assigner leading; 0 if not measured.
	takeover time.Duration
	// recovered is the time from the source's return to every node fresh with the writes
	// made after it (source faults).
	recovered time.Duration
}

// fault is one kind of fault. class decides which bounds apply: "assigner" (a takeover),
// "etcd" and "source" (the term must stay), "link" (staleness), "path", "process".
type fault struct {
	name  string
	class string // "assigner", "etcd", "link", "path", "process"
	run   func(r *run) (outcome, error)
}

// Fault durations, relative to the leases where a lease is what the fault tests.
const (
	// A SIGSTOPped leader stays stopped, and a leader cut off etcd stays cut, for this many
	// of its leases.
	stopLeases    = 4
	etcdCutLeases = 3
	linkHold      = 5 * time.Second
	stallHold     = 15 * time.Second
	downHold      = 2 * time.Second // how long a killed process stays down
	latency       = 250 * time.Millisecond
)

var faults = []fault{
	{"kill-assigner", "assigner", killAssigner},
	{"stop-assigner", "assigner", stopAssigner},
	{"kill-distributor", "process", killDistributor},
	{"kill-node", "process", killNode},
	{"wipe-node", "process", wipeNode},
	{"link-latency", "link", linkLatency},
	{"link-cut", "link", linkCut},
	{"stream-stall", "link", streamStall},
	{"link-stall", "path", linkStall},
	{"etcd-cut", "assigner", etcdCut},
	{"kill-etcd-leader", "etcd", killEtcdLeader},
	{"etcd-source-cut", "source", etcdSourceCut},
}

// hold waits d, the length of a fault, unless the run ends first.
func (r *run) hold(d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
}

// status asks one assigner for its status in target tgt ("" the default target).
func (c *cluster) status(ctx context.Context, tgt, addr string) (*pb.StatusResponse, error) {
	conn, err := grpc.NewClient(addr, append(dial.Target(tgt), c.tls.DialOption("assigner"))...)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return pb.NewAdminServiceClient(conn).Status(ctx, &pb.StatusRequest{})
}

// aim picks, by the run's seed, the target whose leader an assigner fault strikes: the
// default one ("") or a tenant.
func (r *run) aim() string {
	i := r.rng.IntN(len(r.tenants) + 1)
	if i == 0 {
		return ""
	}
	return r.tenants[i-1].name
}

// leader waits for an assigner other than not to lead target tgt ("" the default target),
// and returns it and its term.
func (r *run) leader(tgt string, not *member) (*member, uint64, error) {
	var lead *member
	var term uint64
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	err := launch.WaitFor(ctx, "an assigner to lead", 50*time.Millisecond, func(ctx context.Context) error {
		for _, m := range r.c.assigners {
			if m == not || !m.alive() || m.isFrozen() {
				continue
			}
			st, err := r.c.status(ctx, tgt, m.addr)
			if err == nil && st.GetLeader() {
				lead, term = m, st.GetPosition().GetTerm()
				return nil
			}
		}
		return errors.New("no assigner leads")
	})
	return lead, term, err
}

// takeover measures the time from start until an assigner other than old leads target tgt.
func (r *run) takeover(tgt string, old *member, start time.Time) (outcome, error) {
	name := old.id
	if tgt != "" {
		name = tgt + ": " + name
	}
	lead, _, err := r.leader(tgt, old)
	if err != nil {
		return outcome{target: name}, err
	}
	return outcome{target: name + "→" + lead.id, takeover: time.Since(start)}, nil
}

func killAssigner(r *run) (outcome, error) {
	tgt := r.aim()
	old, _, err := r.leader(tgt, nil)
	if err != nil {
		return outcome{}, err
	}
	old.kill()
	o, err := r.takeover(tgt, old, time.Now())
	if err != nil {
		return o, err
	}
	return o, r.c.restart(r.ctx, old)
}

func stopAssigner(r *run) (outcome, error) {
	tgt := r.aim()
	old, _, err := r.leader(tgt, nil)
	if err != nil {
		return outcome{}, err
	}
	if err := old.stop(); err != nil {
		return outcome{}, err
	}
	start := time.Now()
	defer old.cont()
	o, err := r.takeover(tgt, old, start)
	if err != nil {
		return o, err
	}
	if err := r.hold(stopLeases*r.cfg.sessionTTL - time.Since(start)); err != nil {
		return o, err
	}
	old.cont()
	// The resumed process must notice that it no longer leads.
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	err = launch.WaitFor(ctx, old.id+" to stand by after SIGCONT", 100*time.Millisecond, func(ctx context.Context) error {
		if !old.alive() {
			return launch.Permanent(fmt.Errorf("%s exited after SIGCONT", old.id))
		}
		st, err := r.c.status(ctx, tgt, old.addr)
		if err != nil {
			return err
		}
		if st.GetLeader() {
			return fmt.Errorf("%s still says it leads", old.id)
		}
		return nil
	})
	return o, err
}

func (r *run) pick(ms []*member) *member { return ms[r.rng.IntN(len(ms))] }

// downAndUp kills m, runs between (if any) while it is down, and restarts it after downHold.
func (r *run) downAndUp(m *member, between func() error) (outcome, error) {
	m.kill()
	if between != nil {
		if err := between(); err != nil {
			return outcome{target: m.id}, err
		}
	}
	if err := r.hold(downHold); err != nil {
		return outcome{target: m.id}, err
	}
	return outcome{target: m.id}, r.c.restart(r.ctx, m)
}

func killDistributor(r *run) (outcome, error) {
	return r.downAndUp(r.pick(r.c.distributors), nil)
}

func killNode(r *run) (outcome, error) {
	n := r.pick(r.c.nodes)
	r.probes.skipNode(n.id)
	return r.downAndUp(n, nil)
}

func wipeNode(r *run) (outcome, error) {
	n := r.pick(r.c.nodes)
	r.probes.skipNode(n.id)
	return r.downAndUp(n, func() error { return os.RemoveAll(n.dataDir) })
}

// nodeLinks returns the proxies in front of the nodes' links: to the distributors and to the
// assigners, in name order.
func (r *run) nodeLinks() []string {
	var out []string
	for name := range r.c.proxies {
		if strings.HasPrefix(name, "distributor-") || strings.HasPrefix(name, "assigner-") {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// toxic adds a toxic in both directions of the proxies named, holds it, and removes it.
func (r *run) toxic(names []string, kind, attrs string, d time.Duration) error {
	var added []func()
	defer func() {
		for _, remove := range added {
			remove()
		}
	}()
	for _, name := range names {
		p := r.c.proxies[name]
		for _, stream := range []string{"upstream", "downstream"} {
			id := kind + "_" + stream
			body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, id, kind, stream, attrs)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
				return fmt.Errorf("chaos: adding %s to %s: %w", id, name, err)
			}
			added = append(added, func() { p.Toxics.RemoveToxic(context.Background(), id) }) //nolint:errcheck // it was added
		}
	}
	return r.hold(d)
}

func linkLatency(r *run) (outcome, error) {
	attrs := fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latency.Milliseconds(), latency.Milliseconds()/5)
	return outcome{target: "all node links"}, r.toxic(r.nodeLinks(), "latency", attrs, linkHold)
}

// cut stops the proxies named (closing their connections and refusing new ones) for d.
func (r *run) cut(ps []*toxiproxy.Proxy, d time.Duration) error {
	for _, p := range ps {
		p.Stop()
	}
	err := r.hold(d)
	for _, p := range ps {
		if serr := p.Start(); serr != nil {
			err = errors.Join(err, fmt.Errorf("chaos: restarting proxy %s: %w", p.Name, serr))
		}
	}
	return err
}

func linkCut(r *run) (outcome, error) {
	name := r.nodeLinks()[r.rng.IntN(len(r.nodeLinks()))]
	return outcome{target: name}, r.cut([]*toxiproxy.Proxy{r.c.proxies[name]}, linkHold)
}

// streamStall holds the bytes of the node streams open now to one distributor, with no
// reset, while new connections pass: dead streams a node must notice and replace.
func streamStall(r *run) (outcome, error) {
	d := r.pick(r.c.distributors)
	h := r.c.holds[d.id]
	n := h.Open()
	h.StallExisting()
	defer h.DropStalled() // a held stream is dead for good, as a real one would be
	return outcome{target: fmt.Sprintf("%d streams to %s", n, d.id)}, r.hold(stallHold)
}

// linkStall holds every byte on one distributor's links to nodes (a timeout toxic of 0
// drops data and keeps the connections open) without a reset.
func linkStall(r *run) (outcome, error) {
	d := r.pick(r.c.distributors)
	return outcome{target: "distributor-" + d.id}, r.toxic([]string{"distributor-" + d.id}, "timeout", `{"timeout":0}`, stallHold)
}

// etcdCut cuts the leading assigner off etcd, beyond its lease.
func etcdCut(r *run) (outcome, error) {
	tgt := r.aim()
	old, _, err := r.leader(tgt, nil)
	if err != nil {
		return outcome{}, err
	}
	var ps []*toxiproxy.Proxy
	for _, e := range r.c.etcd {
		ps = append(ps, r.c.proxies["etcd-"+old.id+"-"+e.id])
	}
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- r.cut(ps, etcdCutLeases*r.cfg.sessionTTL) }()
	o, err := r.takeover(tgt, old, start)
	return o, errors.Join(err, <-errc)
}

// killEtcdLeader kills the etcd member that leads, waits for etcd to elect another, and
// restarts it.
func killEtcdLeader(r *run) (outcome, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	var lead *member
	err := launch.WaitFor(ctx, "an etcd leader", 100*time.Millisecond, func(ctx context.Context) (err error) {
		lead, err = r.c.etcdLeader(ctx)
		return err
	})
	if err != nil {
		return outcome{}, err
	}
	lead.kill()
	start := time.Now()
	var next *member
	err = launch.WaitFor(ctx, "a new etcd leader", 100*time.Millisecond, func(ctx context.Context) (err error) {
		next, err = r.c.etcdLeader(ctx)
		return err
	})
	if err != nil {
		return outcome{target: lead.id}, err
	}
	o := outcome{target: fmt.Sprintf("%s→%s in %s", lead.id, next.id, time.Since(start).Round(100*time.Millisecond))}
	if err := r.hold(downHold); err != nil {
		return o, err
	}
	return o, r.c.restart(r.ctx, lead)
}
