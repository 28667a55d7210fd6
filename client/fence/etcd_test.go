package fence_test

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sliceplane/sliceplane/client/fence"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
)

func TestEtcdValuesOrderAsTokens(t *testing.T) {
	tokens := []uint64{0, 1, 9, 10, 99, 100, 1 << 32, math.MaxInt64, 1 << 63, math.MaxUint64 - 1, math.MaxUint64}
	var values []string
	for _, tok := range tokens {
		v := fence.EtcdValue(tok)
		assert.Len(t, v, 20, "%d", tok)
		values = append(values, v)
	}
	assert.True(t, slices.IsSorted(values), "%q", values)
}

func TestEtcdFence(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := t.Context()
	const key = "/fences/r1"
	get := func(k string) string {
		t.Helper()
		resp, err := cli.Get(ctx, k)
		require.NoError(t, err)
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}

	_, err := fence.EtcdTxn(ctx, cli, key, 5, clientv3.OpPut("/data/a", "x"))
	require.ErrorIs(t, err, fence.ErrStale, "before any claim")
	assert.ErrorContains(t, err, "never claimed")
	assert.Empty(t, get("/data/a"))

	require.NoError(t, fence.EtcdClaim(ctx, cli, key, 5))
	require.NoError(t, fence.EtcdClaim(ctx, cli, key, 5), "claiming again with the same token")
	resp, err := fence.EtcdTxn(ctx, cli, key, 5, clientv3.OpPut("/data/a", "old"))
	require.NoError(t, err)
	assert.True(t, resp.Succeeded)
	assert.Equal(t, "old", get("/data/a"))

	require.NoError(t, fence.EtcdClaim(ctx, cli, key, 7))
	_, err = fence.EtcdTxn(ctx, cli, key, 5, clientv3.OpPut("/data/a", "stale"))
	require.ErrorIs(t, err, fence.ErrStale)
	assert.ErrorContains(t, err, "holds token 7")
	assert.Equal(t, "old", get("/data/a"), "a refused write changes nothing")

	err = fence.EtcdClaim(ctx, cli, key, 6)
	require.ErrorIs(t, err, fence.ErrStale, "a lower claim")
	assert.ErrorContains(t, err, "holds token 7")
	assert.Equal(t, fence.EtcdValue(7), get(key), "a refused claim changes nothing")

	_, err = fence.EtcdTxn(ctx, cli, key, 7, clientv3.OpPut("/data/a", "new"))
	require.NoError(t, err)
	assert.Equal(t, "new", get("/data/a"))

	// The largest token: 20 digits, and its successor bound still above it.
	require.NoError(t, fence.EtcdClaim(ctx, cli, key, math.MaxUint64))
	_, err = fence.EtcdTxn(ctx, cli, key, math.MaxUint64, clientv3.OpPut("/data/a", "max"))
	require.NoError(t, err)
	assert.ErrorIs(t, fence.EtcdClaim(ctx, cli, key, math.MaxUint64-1), fence.ErrStale)
}
