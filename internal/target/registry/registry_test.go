package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/target/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTheRegistryKeepsAnAuditTrail: create, update and delete each write the record and an
// audit entry in one transaction; what cannot be done changes nothing; a deletion keeps the
// target's data items and refuses while members are registered.
func TestTheRegistryKeepsAnAuditTrail(t *testing.T) {
	cli := etcdtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := registry.New(cli, "/sp/")
	by := func(action string) registry.Change {
		return registry.Change{Action: action, By: "spiffe://sliceplane/admin/alice", At: time.Now()}
	}
	two := 2
	require.NoError(t, r.Put(ctx, registry.Record{Name: "kv", Config: registry.Config{MinReplicas: &two}, Changed: by("create")}, true))
	assert.ErrorIs(t, r.Put(ctx, registry.Record{Name: "kv", Changed: by("create")}, true), registry.ErrExists)
	assert.ErrorIs(t, r.Put(ctx, registry.Record{Name: "nope", Changed: by("update")}, false), registry.ErrNotFound)
	assert.ErrorIs(t, r.Put(ctx, registry.Record{Name: "default", Changed: by("create")}, true), registry.ErrDefaultFixed)
	require.NoError(t, r.Put(ctx, registry.Record{Name: "kv", Changed: by("update")}, false))

	recs, _, err := r.List(ctx)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Nil(t, recs[0].Config.MinReplicas, "the update replaced the config")
	assert.Equal(t, "update", recs[0].Changed.Action)
	assert.Equal(t, "spiffe://sliceplane/admin/alice", recs[0].Changed.By)

	_, err = cli.Put(ctx, "/sp/t/kv/assigner/nodes/m1", "x")
	require.NoError(t, err)
	_, err = cli.Put(ctx, "/sp/t/kv/data/item", "v")
	require.NoError(t, err)
	assert.ErrorIs(t, r.Delete(ctx, "kv", false, by("delete")), registry.ErrHasMembers)
	require.NoError(t, r.Delete(ctx, "kv", true, by("delete")))
	assert.ErrorIs(t, r.Delete(ctx, "kv", true, by("delete")), registry.ErrNotFound)

	count := func(prefix string) int64 {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		return resp.Count
	}
	assert.Equal(t, int64(0), count("/sp/targets/"))
	assert.Equal(t, int64(0), count("/sp/t/kv/assigner/"), "the map and members go with the target")
	assert.Equal(t, int64(1), count("/sp/t/kv/data/"), "its data items stay")
	assert.Equal(t, int64(3), count("/sp/audit/targets/"), "create, update, delete: refusals leave no entry")
}
