package membership

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const prefix = "/test/"

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestValidateID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"d1", true},
		{"a", true},
		{"Distributor-01", true},
		{"dist_1.zone-a:7000", true},
		{"10.0.0.1:7000", true},
		{strings.Repeat("x", 128), true},
		{"", false},
		{strings.Repeat("x", 129), false},
		{"has space", false},
		{"slash/inside", false},
		{"tab\t", false},
		{"star*", false},
		{"é", false},
		{"nul\x00", false},
	} {
		err := ValidateID(tc.id)
		if tc.ok {
			assert.NoError(t, err, "%q", tc.id)
		} else {
			assert.Error(t, err, "%q", tc.id)
		}
	}
}

func TestRegisterThenLoad(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := ctxT(t, 20*time.Second)
	set, rev, err := Load(ctx, cli, prefix)
	require.NoError(t, err)
	assert.Empty(t, set)
	assert.NotNil(t, set)
	assert.Positive(t, rev)

	r1, err := Register(ctx, cli, prefix, "d1", "10.0.0.1:7000", 5*time.Second)
	require.NoError(t, err)
	defer r1.Close()
	r2, err := Register(ctx, cli, prefix, "d2", "10.0.0.2:7000", 5*time.Second)
	require.NoError(t, err)
	defer r2.Close()

	set, rev2, err := Load(ctx, cli, prefix)
	require.NoError(t, err)
	assert.Equal(t, quantum.Distributors{"d1": "10.0.0.1:7000", "d2": "10.0.0.2:7000"}, set)
	assert.Greater(t, rev2, rev)

	// Another prefix is another cluster.
	other, _, err := Load(ctx, cli, "/other/")
	require.NoError(t, err)
	assert.Empty(t, other)

	// The key is bound to a lease of the TTL asked for.
	resp, err := cli.Get(ctx, prefix+"distributors/d1")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.NotZero(t, resp.Kvs[0].Lease, "the registration is under a lease")
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	assert.Equal(t, int64(5), ttl.GrantedTTL)
}

func TestRegisterRejectsBadArguments(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := ctxT(t, 20*time.Second)
	for _, tc := range []struct {
		name, id, addr string
		ttl            time.Duration
	}{
		{"empty id", "", "h:1", time.Second},
		{"bad id", "no/slash", "h:1", time.Second},
		{"long id", strings.Repeat("x", 129), "h:1", time.Second},
		{"no address", "d1", "", time.Second},
		{"zero ttl", "d1", "h:1", 0},
		{"sub-second ttl", "d1", "h:1", 999 * time.Millisecond},
		{"negative ttl", "d1", "h:1", -time.Second},
	} {
		r, err := Register(ctx, cli, prefix, tc.id, tc.addr, tc.ttl)
		assert.Error(t, err, tc.name)
		assert.Nil(t, r, tc.name)
	}
	set, _, err := Load(ctx, cli, prefix)
	require.NoError(t, err)
	assert.Empty(t, set, "a refused registration writes nothing")
	leases, err := cli.Leases(ctx)
	require.NoError(t, err)
	assert.Empty(t, leases.Leases, "a refused registration leaves no lease behind")
}

func TestCloseLeavesTheSet(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := ctxT(t, 20*time.Second)
	r, err := Register(ctx, cli, prefix, "d1", "h:1", 30*time.Second)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	// Close revokes the lease: the key goes at once, not when the 30 s TTL lapses.
	set, _, err := Load(ctx, cli, prefix)
	require.NoError(t, err)
	assert.Empty(t, set)
	select {
	case <-r.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done is not closed after Close")
	}
}

func TestReRegisteringReplacesTheAddress(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := ctxT(t, 20*time.Second)
	old, err := Register(ctx, cli, prefix, "d1", "old:1", 30*time.Second)
	require.NoError(t, err)
	cur, err := Register(ctx, cli, prefix, "d1", "new:1", 30*time.Second)
	require.NoError(t, err)
	defer cur.Close()
	set, _, err := Load(ctx, cli, prefix)
	require.NoError(t, err)
	assert.Equal(t, quantum.Distributors{"d1": "new:1"}, set)
	// The old registration no longer holds the key: closing it leaves the new one.
	require.NoError(t, old.Close())
	set, _, err = Load(ctx, cli, prefix)
	require.NoError(t, err)
	assert.Equal(t, quantum.Distributors{"d1": "new:1"}, set)
}

// expect reads sets from ch until one equals want, failing at the deadline, and returns it.
func expect(t *testing.T, ch <-chan quantum.Distributors, want quantum.Distributors, what string) quantum.Distributors {
	t.Helper()
	deadline := time.After(10 * time.Second)
	var last quantum.Distributors
	for {
		select {
		case got, ok := <-ch:
			require.True(t, ok, "%s: the watch ended", what)
			if got.Equal(want) {
				return got
			}
			last = got
		case <-deadline:
			t.Fatalf("%s: want %v, last got %v", what, want, last)
		}
	}
}

func TestWatchFollowsTheSet(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := ctxT(t, 30*time.Second)
	set, rev, err := Load(ctx, cli, prefix)
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	ch := Watch(wctx, cli, prefix, set, rev)
	defer func() {
		cancel()
		for range ch { // the watch closes its channel once ctx ends
		}
	}()

	r1, err := Register(ctx, cli, prefix, "d1", "h1:1", 5*time.Second)
	require.NoError(t, err)
	defer r1.Close()
	select {
	case got := <-ch:
		assert.Equal(t, quantum.Distributors{"d1": "h1:1"}, got, "the first change is the registration")
	case <-time.After(10 * time.Second):
		t.Fatal("the registration was not delivered")
	}

	r2, err := Register(ctx, cli, prefix, "d2", "h2:1", 5*time.Second)
	require.NoError(t, err)
	defer r2.Close()
	expect(t, ch, quantum.Distributors{"d1": "h1:1", "d2": "h2:1"}, "a second distributor registers")

	// Changes outside the directory are not the set's.
	_, err = cli.Put(ctx, prefix+"other", "x")
	require.NoError(t, err)

	require.NoError(t, r1.Close())
	got := expect(t, ch, quantum.Distributors{"d2": "h2:1"}, "the first one closes")

	// Each delivered set is the receiver's: changing one changes nothing for later ones.
	got["bogus"] = "x"
	r3, err := Register(ctx, cli, prefix, "d3", "h3:1", 5*time.Second)
	require.NoError(t, err)
	defer r3.Close()
	expect(t, ch, quantum.Distributors{"d2": "h2:1", "d3": "h3:1"}, "a third registers")
}

func TestWatchStartsFromTheGivenRevision(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := ctxT(t, 30*time.Second)
	r1, err := Register(ctx, cli, prefix, "d1", "h1:1", 5*time.Second)
	require.NoError(t, err)
	defer r1.Close()
	set, rev, err := Load(ctx, cli, prefix)
	require.NoError(t, err)
	// A change between the Load and the Watch is not missed.
	r2, err := Register(ctx, cli, prefix, "d2", "h2:1", 5*time.Second)
	require.NoError(t, err)
	defer r2.Close()

	wctx, cancel := context.WithCancel(ctx)
	ch := Watch(wctx, cli, prefix, set, rev)
	select {
	case got := <-ch:
		assert.Equal(t, quantum.Distributors{"d1": "h1:1", "d2": "h2:1"}, got)
	case <-time.After(10 * time.Second):
		t.Fatal("the change after the Load was not delivered")
	}
	assert.Equal(t, quantum.Distributors{"d1": "h1:1"}, set, "Watch does not change the caller's set")
	cancel()
	select {
	case _, ok := <-ch:
		assert.False(t, ok, "the channel closes once ctx ends")
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end with its context")
	}
}

func TestDoneWhenTheLeaseIsRevokedElsewhere(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := ctxT(t, 30*time.Second)
	r, err := Register(ctx, cli, prefix, "d1", "h:1", time.Second)
	require.NoError(t, err)
	select {
	case <-r.Done():
		t.Fatal("Done before the lease is lost")
	default:
	}
	resp, err := cli.Get(ctx, prefix+"distributors/d1")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	_, err = cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	select {
	case <-r.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done is not closed once the lease is revoked")
	}
	set, _, err := Load(ctx, cli, prefix)
	require.NoError(t, err)
	assert.Empty(t, set)
	_ = r.Close() // the lease is already gone: whatever Close says, it must not hang
}

func TestDoneWhenTheContextEnds(t *testing.T) {
	cli := etcdtest.New(t)
	ctx, cancel := context.WithCancel(ctxT(t, 30*time.Second))
	r, err := Register(ctx, cli, prefix, "d1", "h:1", 2*time.Second)
	require.NoError(t, err)
	defer r.Close()
	cancel()
	select {
	case <-r.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done is not closed once the registration's context ends")
	}
}
