// Package membership keeps sets of live processes in etcd: the distributors of a target,
// which the assigner watches to tell every node which distributor serves it, and the live
// assigners, among which targets are spread. A process registers under a lease, so that one
// that dies leaves the set when its lease lapses. LoadSet and WatchSet read and follow any
// such set of keys under one etcd prefix, the registry of targets included.
package membership

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/sliceplane/sliceplane/internal/quantum"
)

// dir is where distributors register, under the cluster's prefix; AssignersDir is where
// assigners do.
const (
	dir          = "distributors/"
	AssignersDir = "assigners/"
)

// ValidateID checks a distributor ID: 1-128 letters, digits and . _ - : (it is part of an
// etcd key and of metric labels).
func ValidateID(id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("membership: distributor ID %q: want 1-128 characters", id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-:", r)) {
			return fmt.Errorf("membership: distributor ID %q: %q is not a letter or digit, nor one of the marks . _ - or colon", id, r)
		}
	}
	return nil
}

// Registration is a distributor's membership, held while its lease lives.
type Registration struct {
	cli     *clientv3.Client
	session *concurrency.Session
}

// Register adds distributor id, serving at addr, to the set under prefix, with a lease of
// ttl (whole seconds, at least 1). The registration lasts until Close, ctx ends or the lease
// is lost (Done); another live registration of the same ID is replaced.
func Register(ctx context.Context, cli *clientv3.Client, prefix, id, addr string, ttl time.Duration) (*Registration, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	return register(ctx, cli, "distributor", prefix+dir, id, addr, ttl)
}

// RegisterAssigner adds the assigner advertised at addr to the live assigners under prefix,
// as Register adds a distributor.
func RegisterAssigner(ctx context.Context, cli *clientv3.Client, prefix, addr string, ttl time.Duration) (*Registration, error) {
	return register(ctx, cli, "assigner", prefix+AssignersDir, addr, addr, ttl)
}

func register(ctx context.Context, cli *clientv3.Client, kind, key, id, addr string, ttl time.Duration) (*Registration, error) {
	if addr == "" {
		return nil, fmt.Errorf("membership: %s %s has no address", kind, id)
	}
	secs := int(ttl / time.Second)
	if secs < 1 {
		return nil, fmt.Errorf("membership: lease of %s: etcd leases last whole seconds, at least 1 s", ttl)
	}
	session, err := concurrency.NewSession(cli, concurrency.WithTTL(secs), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("membership: opening a lease for %s %s: %w", kind, id, err)
	}
	if _, err := cli.Put(ctx, key+id, addr, clientv3.WithLease(session.Lease())); err != nil {
		session.Orphan()
		revoke(cli, session)
		return nil, fmt.Errorf("membership: registering %s %s: %w", kind, id, err)
	}
	return &Registration{cli: cli, session: session}, nil
}

// Done is closed when the lease is lost: the distributor is no longer in the set.
func (r *Registration) Done() <-chan struct{} { return r.session.Done() }

// Close leaves the set at once, by revoking the lease, so that nodes move without waiting for
// it to lapse.
func (r *Registration) Close() error {
	r.session.Orphan()
	return revoke(r.cli, r.session)
}

func revoke(cli *clientv3.Client, s *concurrency.Session) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := cli.Revoke(ctx, s.Lease()); err != nil {
		return fmt.Errorf("membership: revoking lease %x: %w", s.Lease(), err)
	}
	return nil
}

// Load reads the set of distributors under prefix and the etcd revision it was read at.
func Load(ctx context.Context, cli *clientv3.Client, prefix string) (quantum.Distributors, int64, error) {
	return LoadSet(ctx, cli, prefix+dir)
}

// LoadSet reads the keys under key, each by its name after key, and the etcd revision they
// were read at.
func LoadSet(ctx context.Context, cli *clientv3.Client, key string) (map[string]string, int64, error) {
	resp, err := cli.Get(ctx, key, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("membership: reading %s: %w", key, err)
	}
	set := map[string]string{}
	for _, kv := range resp.Kvs {
		set[strings.TrimPrefix(string(kv.Key), key)] = string(kv.Value)
	}
	return set, resp.Header.Revision, nil
}

// Watch delivers the whole set of distributors after every change following revision rev,
// until ctx ends; then it closes the channel. A watch that fails is restarted from a fresh
// Load, so no change is missed, though changes that cancel out may not be seen.
func Watch(ctx context.Context, cli *clientv3.Client, prefix string, set quantum.Distributors, rev int64) <-chan quantum.Distributors {
	return WatchSet(ctx, cli, prefix+dir, set, rev)
}

// WatchSet delivers the whole set of keys under key (as LoadSet reads it) after every change
// following revision rev, until ctx ends; then it closes the channel. A watch that fails is
// restarted from a fresh LoadSet, so no change is missed, though changes that cancel out may
// not be seen.
func WatchSet[S ~map[string]string](ctx context.Context, cli *clientv3.Client, key string, set S, rev int64) <-chan S {
	out := make(chan S)
	go func() {
		defer close(out)
		set = maps.Clone(set)
		backoff := 50 * time.Millisecond
		for ctx.Err() == nil {
			err := watch(ctx, cli, key, set, rev, out)
			if ctx.Err() != nil {
				return
			}
			select { // the watch failed: start over from what etcd holds now
			case <-time.After(backoff):
			case <-ctx.Done():
				return
			}
			backoff = min(2*backoff, 2*time.Second)
			fresh, at, lerr := LoadSet(ctx, cli, key)
			if lerr != nil {
				continue
			}
			_ = err // the failure is recovered from; LoadSet's result says what changed meanwhile
			if !maps.Equal(S(fresh), set) && !send(ctx, out, S(fresh)) {
				return
			}
			set, rev = S(fresh), at
		}
	}()
	return out
}

// watch follows the set from rev until the watch fails or ctx ends, keeping set current.
func watch[S ~map[string]string](ctx context.Context, cli *clientv3.Client, key string, set S, rev int64, out chan<- S) error {
	for resp := range cli.Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return err
		}
		for _, ev := range resp.Events {
			id := strings.TrimPrefix(string(ev.Kv.Key), key)
			if ev.Type == clientv3.EventTypeDelete {
				delete(set, id)
			} else {
				set[id] = string(ev.Kv.Value)
			}
		}
		if len(resp.Events) > 0 && !send(ctx, out, maps.Clone(set)) {
			return ctx.Err()
		}
	}
	return errors.New("membership: watch ended")
}

func send[S ~map[string]string](ctx context.Context, out chan<- S, set S) bool {
	select {
	case out <- set:
		return true
	case <-ctx.Done():
		return false
	}
}
