package chaos_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/target/registry"
)

// defaultTenants are the targets a run keeps beside the default one when CHAOS_TARGETS is
// unset: one, so that every run checks that a fault of the control plane loses nothing in
// either target, and that the targets do not mix.
const defaultTenants = "second"

// tenant is a target of a run beside the default one: its own distributor and nodes (with
// certificates confined to it), its items under its own etcd data prefix, its own writer,
// reader and staleness sampler. The faults of the control plane (assigners, etcd) strike it
// too; the faults of one process strike the default target's.
type tenant struct {
	name   string
	c      *cluster
	src    source.Writer
	w      itemWriter
	probes *probes
}

// nodes returns the tenant's nodes.
func (tn *tenant) nodes() []*member {
	var out []*member
	for _, m := range tn.c.tenants[tn.name] {
		if m.kind == "node" {
			out = append(out, m)
		}
	}
	return out
}

// tenantsOf parses CHAOS_TARGETS: the names of the targets beside the default one,
// comma-separated; "none" for a run of the default target alone.
func tenantsOf(v string) ([]string, error) {
	switch v {
	case "":
		v = defaultTenants
	case "none":
		return nil, nil
	}
	var out []string
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		if err := target.CheckName(name); err != nil || name == target.Default {
			return nil, fmt.Errorf("CHAOS_TARGETS: %q is not a target beside the default one (%v)", name, err)
		}
		out = append(out, name)
	}
	return out, nil
}

// declareTenants writes the run's targets into a --targets file and gives it to the
// assigners: each assigner declares them at start, as a GitOps deployment would.
func (r *run) declareTenants(dir string) {
	if len(r.cfg.tenants) == 0 {
		return
	}
	declared := map[string]registry.Config{}
	for _, name := range r.cfg.tenants {
		declared[name] = registry.Config{}
		r.tenants = append(r.tenants, &tenant{name: name, c: r.c})
	}
	file := filepath.Join(dir, "targets.yaml")
	if err := os.WriteFile(file, registry.MarshalFile(declared), 0o644); err != nil {
		r.t.Fatal(err)
	}
	r.c.assignerArgs = append(r.c.assignerArgs, "--targets", file)
}

// startTenants starts a distributor and two nodes of each tenant, their IDs prefixed with
// its name: the proxies and logs of the cluster are named by ID.
func (r *run) startTenants() {
	for _, tn := range r.tenants {
		if err := r.c.startDistributor(r.ctx, tn.name, tn.name+"-d1"); err != nil {
			r.t.Fatal(err)
		}
		for _, id := range []string{"n1", "n2"} {
			if err := r.c.startNode(r.ctx, tn.name, tn.name+"-"+id); err != nil {
				r.t.Fatal(err)
			}
		}
	}
}

// setUpTenants fills each tenant's items, starts its probes' router and spreads and freezes
// its map, as setUp does the default target's.
func (r *run) setUpTenants() {
	for _, tn := range r.tenants {
		prefix := target.DataPrefix(strings.TrimSuffix(writer.DefaultPrefix, "data/"), tn.name)
		tn.w, tn.src = writer.New(r.c.etcdCli, prefix), source.NewEtcd(r.c.etcdCli, prefix)
		r.fill(tn.w)
		tn.probes = r.newProbes(tn.name, tn.w, tn.nodes())
		r.spread(tn.name, tn.probes, tn.nodes())
	}
}

// windows ends the probes' windows of every target and returns what they saw: the default
// target's, then the tenants' in order.
func (r *run) windows() (window, []window) {
	w := r.probes.window()
	var others []window
	for _, tn := range r.tenants {
		others = append(others, tn.probes.window())
	}
	return w, others
}
