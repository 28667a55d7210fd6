package client_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// app is an Application that records what it holds, and whose acquires a test can hold up
// or fail.
type app struct {
	mu    sync.Mutex
	held  keyspace.Set
	calls []string
	// gate, while set, holds every acquire until it is closed or the call's context ends;
	// fail, while set, fails every acquire.
	gate chan struct{}
	fail error
}

func (a *app) Acquire(ctx context.Context, r client.Range, g client.Grant) error {
	a.mu.Lock()
	gate, fail := a.gate, a.fail
	a.calls = append(a.calls, fmt.Sprintf("acquire %s %s", r, g))
	a.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail != nil {
		return fail
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held = a.held.Union(keyspace.NewSet(keyspaceRange(r)))
	return nil
}

func (a *app) Release(_ context.Context, r client.Range) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, fmt.Sprintf("release %s", r))
	a.held = a.held.Minus(keyspace.NewSet(keyspaceRange(r)))
	return nil
}

func (a *app) ChangeRole(context.Context, client.Range, client.Grant) error {
	return errors.New("app: no roles here")
}

func (a *app) holding() keyspace.Set {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

func (a *app) set(gate chan struct{}, fail error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gate, a.fail = gate, fail
}

func keyspaceRange(r client.Range) keyspace.Range {
	out := keyspace.Range{Start: r.Start, End: keyspace.End}
	if !r.End.IsEnd() {
		out.End = keyspace.At(r.End.Point())
	}
	return out
}

// startMember runs a member of c with app a until the test ends.
func startMember(t *testing.T, c *clustertest.Cluster, id string, a *app, timeout time.Duration) *client.Member {
	t.Helper()
	m, err := client.NewMember(client.MemberConfig{ID: id, Address: id + ":1", Assigners: c.Assigners(), App: a,
		ReportInterval: 100 * time.Millisecond, CallTimeout: timeout, Logger: quiet()})
	require.NoError(t, err)
	runMember(t, m)
	return m
}

// TestMembersOwnTheMapWithoutADataPath runs two members and no distributor: between them
// their applications hold the whole key space, once each; a move is make-before-break (the
// old holder keeps the range until the new one's acquire returned); a failed acquire keeps
// the range loading, and the handoff rolls back; a drain hands everything over.
func TestMembersOwnTheMapWithoutADataPath(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		cfg.Core.HandoffTimeout, cfg.Core.HandoffLinger = 3*time.Second, 200*time.Millisecond
	}})
	a1, a2 := &app{}, &app{}
	m1 := startMember(t, c, "m1", a1, 10*time.Second)
	m2 := startMember(t, c, "m2", a2, 10*time.Second)
	full := keyspace.NewSet(keyspace.Full())
	whole := func() bool {
		h1, h2 := a1.holding(), a2.holding()
		return h1.Union(h2).Equal(full) && h1.Intersect(h2).Empty() && !h1.Empty() && !h2.Empty()
	}
	waitFor(t, 30*time.Second, "the members hold the key space between them", whole)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	adm := newAdmin(c)
	_, err := adm.Freeze(ctx, &pb.FreezeRequest{Reason: "member test"}, grpc.WaitForReady(true))
	require.NoError(t, err)

	// A move to m2 while m2's acquires wait: m1 keeps serving the range.
	r := a1.holding().Ranges()[0]
	key := keyIn(r)
	gate := make(chan struct{})
	a2.set(gate, nil)
	_, err = adm.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}, To: []string{"m2"}})
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "m2 loads the range", func() bool { return m2.Loading(client.Hash(key)) })
	require.True(t, a1.holding().Contains(client.Hash(key)), "m1 let the range go before m2 had it")
	require.True(t, m1.Serving(key))
	close(gate)
	a2.set(nil, nil)
	waitFor(t, 10*time.Second, "m2 serves the range, m1 released it", func() bool {
		return m2.Serving(key) && !a1.holding().Contains(client.Hash(key)) && a2.holding().Contains(client.Hash(key))
	})
	require.True(t, whole(), "the key space is held once")

	// A move to m1 whose acquires fail: the range stays m2's once the handoff rolls back.
	a1.set(nil, errors.New("app: the disk is full"))
	_, err = adm.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}, To: []string{"m1"}})
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "m1 loads the range", func() bool { return m1.Loading(client.Hash(key)) })
	waitFor(t, 20*time.Second, "the handoff rolls back", func() bool {
		return !m1.Loading(client.Hash(key)) && !m1.Serving(key) && m2.Serving(key)
	})
	require.True(t, a2.holding().Contains(client.Hash(key)))
	require.False(t, a1.holding().Contains(client.Hash(key)))
	a1.set(nil, nil)

	// m2 drains: m1 acquires all, then m2 releases all.
	_, err = adm.Unfreeze(ctx, &pb.UnfreezeRequest{})
	require.NoError(t, err)
	require.NoError(t, m2.Drain(ctx))
	require.True(t, a1.holding().Equal(full), "m1 holds %s", a1.holding())
	require.True(t, a2.holding().Empty(), "m2 holds %s", a2.holding())
	a2.mu.Lock()
	defer a2.mu.Unlock()
	require.True(t, slices.ContainsFunc(a2.calls, func(s string) bool { return len(s) > 7 && s[:7] == "release" }))
}

// keyIn returns a key whose hash lies in r.
func keyIn(r keyspace.Range) []byte {
	for i := 0; ; i++ {
		k := fmt.Appendf(nil, "key-%d", i)
		if r.Contains(client.Hash(k)) {
			return k
		}
	}
}
