package writer_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T) (context.Context, *clientv3.Client, *writer.Writer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	cli := etcdtest.New(t)
	return ctx, cli, writer.New(cli, writer.DefaultPrefix)
}

// clocks returns the clock (mod revision) of every etcd key under the default prefix.
func clocks(t *testing.T, ctx context.Context, cli *clientv3.Client) map[uint64]int {
	t.Helper()
	resp, err := cli.Get(ctx, writer.DefaultPrefix, clientv3.WithPrefix())
	require.NoError(t, err)
	out := map[uint64]int{}
	for _, kv := range resp.Kvs {
		out[uint64(kv.ModRevision)]++
	}
	return out
}

func revision(t *testing.T, ctx context.Context, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(ctx, "any", clientv3.WithCountOnly())
	require.NoError(t, err)
	return resp.Header.Revision
}

func TestPutGetDelete(t *testing.T) {
	ctx, _, w := setup(t)
	key := []byte("user:\x00/1")

	c1, err := w.Put(ctx, key, []byte("alice"))
	require.NoError(t, err)
	c2, err := w.PutFragment(ctx, key, "msg/1", []byte("hi"))
	require.NoError(t, err)
	c3, err := w.PutFragment(ctx, key, "msg/2", nil)
	require.NoError(t, err)
	assert.Less(t, c1, c2)
	assert.Less(t, c2, c3)

	it, ok, err := w.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, writer.Item{Key: key, Value: []byte("alice"), HasValue: true, Fragments: []writer.Fragment{
		{ID: "msg/1", Value: []byte("hi")}, {ID: "msg/2"},
	}}, it)

	c4, err := w.DeleteFragment(ctx, key, "msg/1")
	require.NoError(t, err)
	assert.Less(t, c3, c4)
	c5, err := w.Put(ctx, key, nil)
	require.NoError(t, err)
	it, ok, err = w.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, it.HasValue, "an empty value is a value")
	assert.Empty(t, it.Value)
	assert.Equal(t, []writer.Fragment{{ID: "msg/2"}}, it.Fragments, "a put keeps the fragments")

	c6, err := w.Delete(ctx, key)
	require.NoError(t, err)
	assert.Less(t, c5, c6)
	_, ok, err = w.Get(ctx, key)
	require.NoError(t, err)
	assert.False(t, ok, "delete removes the value and the fragments")

	_, err = w.PutFragment(ctx, key, "only", []byte("f"))
	require.NoError(t, err)
	it, ok, err = w.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, ok, "an item may consist of fragments alone")
	assert.False(t, it.HasValue)
	assert.Nil(t, it.Value)
}

func TestInvalidInputWritesNothing(t *testing.T) {
	ctx, cli, w := setup(t)
	before := revision(t, ctx, cli)
	cases := map[string]func() error{
		"put empty key":          func() error { _, err := w.Put(ctx, nil, []byte("v")); return err },
		"put fragment empty key": func() error { _, err := w.PutFragment(ctx, []byte{}, "f", nil); return err },
		"put empty fragment ID":  func() error { _, err := w.PutFragment(ctx, []byte("k"), "", nil); return err },
		"delete empty key":       func() error { _, err := w.Delete(ctx, nil); return err },
		"delete empty fragment":  func() error { _, err := w.DeleteFragment(ctx, []byte("k"), ""); return err },
		"get empty key":          func() error { _, _, err := w.Get(ctx, nil); return err },
		"many, empty key": func() error {
			_, err := w.PutMany(ctx, []writer.Item{{Key: []byte("a"), HasValue: true}, {HasValue: true}})
			return err
		},
		"many, nothing to write": func() error {
			_, err := w.PutMany(ctx, []writer.Item{{Key: []byte("a"), HasValue: true}, {Key: []byte("b"), Value: []byte("v")}})
			return err
		},
		"many, empty fragment ID": func() error {
			_, err := w.PutMany(ctx, []writer.Item{{Key: []byte("a"), Fragments: []writer.Fragment{{ID: ""}}}})
			return err
		},
		"many, fragment twice": func() error {
			_, err := w.PutMany(ctx, []writer.Item{{Key: []byte("a"), Fragments: []writer.Fragment{{ID: "f"}, {ID: "f"}}}})
			return err
		},
	}
	for name, op := range cases {
		err := op()
		require.ErrorIs(t, err, writer.ErrInvalid, name)
	}
	assert.Equal(t, before, revision(t, ctx, cli), "nothing was written")

	_, err := w.PutMany(ctx, []writer.Item{{Key: []byte("b"), Value: []byte("v")}})
	assert.ErrorContains(t, err, `item 0: writer: invalid item: item "b": no value (HasValue is false) and no fragments`)
}

func TestPutManyBatchesUpToTheTxnLimit(t *testing.T) {
	ctx, cli, w := setup(t)
	const n = 300
	items := make([]writer.Item, n)
	for i := range items {
		items[i] = writer.Item{Key: fmt.Appendf(nil, "k%03d", i), Value: fmt.Appendf(nil, "v%d", i), HasValue: true}
	}
	clock, err := w.PutMany(ctx, items)
	require.NoError(t, err)

	cs := clocks(t, ctx, cli)
	assert.Len(t, cs, (n+writer.MaxTxnOps-1)/writer.MaxTxnOps, "ceil(n/128) transactions")
	for c, count := range cs {
		assert.LessOrEqual(t, count, writer.MaxTxnOps)
		assert.LessOrEqual(t, c, clock, "the clock returned is the last one")
	}
	assert.Contains(t, cs, clock)
	for _, i := range []int{0, 127, 128, 299} {
		it, ok, err := w.Get(ctx, items[i].Key)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, items[i].Value, it.Value)
	}

	clock, err = w.PutMany(ctx, nil)
	require.NoError(t, err)
	assert.Zero(t, clock, "nothing to write")
}

func TestPutManySplitsWhatOneTransactionCannotHold(t *testing.T) {
	ctx, cli, w := setup(t)
	big := bytes.Repeat([]byte("x"), 300<<10)
	frags := make([]writer.Fragment, 200)
	for i := range frags {
		frags[i] = writer.Fragment{ID: fmt.Sprintf("f/%03d", i), Value: []byte{byte(i)}}
	}
	items := []writer.Item{
		{Key: []byte("small"), Value: []byte("1"), HasValue: true},
		{Key: []byte("many-fragments"), Fragments: frags},
		{Key: []byte("small"), Value: []byte("2"), HasValue: true}, // given twice: the later wins
	}
	for i := range 10 { // 3 MB in all, twice what etcd takes in one request
		items = append(items, writer.Item{Key: fmt.Appendf(nil, "big%d", i), Value: big, HasValue: true})
	}
	_, err := w.PutMany(ctx, items)
	require.NoError(t, err)

	it, ok, err := w.Get(ctx, []byte("small"))
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []byte("2"), it.Value)
	it, ok, err = w.Get(ctx, []byte("many-fragments"))
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, frags, it.Fragments)
	for i := range 10 {
		it, ok, err := w.Get(ctx, fmt.Appendf(nil, "big%d", i))
		require.NoError(t, err)
		require.True(t, ok)
		assert.Len(t, it.Value, len(big))
	}
	assert.GreaterOrEqual(t, len(clocks(t, ctx, cli)), 5, "the big items took several transactions")
}

func TestPutManyReportsWhatWasWritten(t *testing.T) {
	ctx, _, w := setup(t)
	items := []writer.Item{
		{Key: []byte("a"), Value: []byte("1"), HasValue: true},
		{Key: []byte("b"), Value: bytes.Repeat([]byte("x"), 1700<<10), HasValue: true}, // over etcd's 1.5 MiB
	}
	_, err := w.PutMany(ctx, items)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "putting items 1..1 of 2 (those before 1 are written)")
	assert.Contains(t, err.Error(), "request is too large")
	_, ok, err := w.Get(ctx, []byte("a"))
	require.NoError(t, err)
	assert.True(t, ok)
}
