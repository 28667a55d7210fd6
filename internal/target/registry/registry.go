// Package registry keeps a cluster's targets in etcd, each with its config (target.yaml),
// and every change to them in an audit trail beside them.
package registry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/target"
)

// Errors of the registry, for their status codes.
var (
	ErrExists       = errors.New("registry: already exists")
	ErrNotFound     = errors.New("registry: no such target")
	ErrHasMembers   = errors.New("registry: members are registered")
	ErrDefaultFixed = errors.New("registry: the default target takes its config from the assigner's flags")
)

// Record is a registered target: its config and who changed it last.
type Record struct {
	Name    string `json:"name"`
	Config  Config `json:"config"`
	Changed Change `json:"changed"`
}

// Change says who changed a target, how and when, for the audit trail.
type Change struct {
	Action string    `json:"action"` // create, update, delete
	By     string    `json:"by"`     // the authenticated caller
	Claims string    `json:"claims,omitempty"`
	At     time.Time `json:"at"`
}

// Registry keeps the targets of a cluster in etcd: each under <prefix>targets/<name>, and
// every change also under <prefix>audit/targets/, in the same transaction.
type Registry struct {
	cli    *clientv3.Client
	prefix string
}

// New returns the registry of the cluster under prefix.
func New(cli *clientv3.Client, prefix string) *Registry {
	return &Registry{cli: cli, prefix: prefix}
}

func (r *Registry) dir() string            { return r.prefix + "targets/" }
func (r *Registry) key(name string) string { return r.dir() + name }
func (r *Registry) auditKey(c Change, name string) string {
	return fmt.Sprintf("%saudit/targets/%020d-%s", r.prefix, c.At.UnixNano(), name)
}

// List returns the registered targets by name, and the revision they were read at.
func (r *Registry) List(ctx context.Context) ([]Record, int64, error) {
	set, rev, err := membership.LoadSet(ctx, r.cli, r.dir())
	if err != nil {
		return nil, 0, fmt.Errorf("registry: listing: %w", err)
	}
	recs, err := Decode(set)
	return recs, rev, err
}

// Decode returns the records of a set of registry keys (as membership.WatchSet delivers
// them), sorted by name.
func Decode(set map[string]string) ([]Record, error) {
	out := make([]Record, 0, len(set))
	for name, v := range set {
		var rec Record
		if err := json.Unmarshal([]byte(v), &rec); err != nil {
			return nil, fmt.Errorf("registry: the record of %s: %w", name, err)
		}
		rec.Name = name
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// Watch delivers the registered targets after every change following revision rev.
func (r *Registry) Watch(ctx context.Context, set map[string]string, rev int64) <-chan map[string]string {
	return membership.WatchSet(ctx, r.cli, r.dir(), set, rev)
}

// Raw returns the registry's keys as Watch delivers them, and their revision.
func (r *Registry) Raw(ctx context.Context) (map[string]string, int64, error) {
	return membership.LoadSet(ctx, r.cli, r.dir())
}

// Put creates (create) or replaces target rec.Name, checking its name and, against base,
// its config; it refuses to create one that exists or to replace one that does not.
func (r *Registry) Put(ctx context.Context, rec Record, create bool) error {
	if err := checkMutable(rec.Name); err != nil {
		return err
	}
	value, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("registry: encoding %s: %w", rec.Name, err)
	}
	exists := clientv3.Compare(clientv3.CreateRevision(r.key(rec.Name)), ">", 0)
	if create {
		exists = clientv3.Compare(clientv3.CreateRevision(r.key(rec.Name)), "=", 0)
	}
	resp, err := r.cli.Txn(ctx).If(exists).
		Then(clientv3.OpPut(r.key(rec.Name), string(value)), clientv3.OpPut(r.auditKey(rec.Changed, rec.Name), string(value))).
		Commit()
	switch {
	case err != nil:
		return fmt.Errorf("registry: writing %s: %w", rec.Name, err)
	case !resp.Succeeded && create:
		return fmt.Errorf("%w: %s", ErrExists, rec.Name)
	case !resp.Succeeded:
		return fmt.Errorf("%w: %s", ErrNotFound, rec.Name)
	}
	return nil
}

// Delete removes target name and its assigner state (map, members, history, size); its data
// items, if its source is an etcd prefix, stay. It refuses while members are registered,
// unless force.
func (r *Registry) Delete(ctx context.Context, name string, force bool, c Change) error {
	if err := checkMutable(name); err != nil {
		return err
	}
	state := target.Root(r.prefix, name) + "assigner/"
	members, err := r.cli.Get(ctx, state+"nodes/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("registry: counting the members of %s: %w", name, err)
	}
	if members.Count > 0 && !force {
		return fmt.Errorf("%w: %s has %d registered members; drain them first, or delete with --force", ErrHasMembers, name, members.Count)
	}
	c.Action = "delete"
	value, _ := json.Marshal(Record{Name: name, Changed: c})
	resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key(name)), ">", 0)).
		Then(clientv3.OpDelete(r.key(name)), clientv3.OpDelete(state, clientv3.WithPrefix()),
			clientv3.OpDelete(target.SizeKey(r.prefix, name)), clientv3.OpPut(r.auditKey(c, name), string(value))).
		Commit()
	switch {
	case err != nil:
		return fmt.Errorf("registry: deleting %s: %w", name, err)
	case !resp.Succeeded:
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return nil
}

func checkMutable(name string) error {
	if name == target.Default {
		return ErrDefaultFixed
	}
	return target.CheckName(name)
}
