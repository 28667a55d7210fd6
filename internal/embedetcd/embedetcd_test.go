package embedetcd

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartServesAndRestartsFromItsDirectory(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	s, err := Start(ctx, Options{Dir: dir, Fast: true, LogLevel: "fatal"})
	require.NoError(t, err)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	_, err = c.Put(ctx, "k", "v")
	require.NoError(t, err)
	require.NoError(t, c.Close())
	s.Close()

	s, err = Start(ctx, Options{Dir: dir, Fast: true, LogLevel: "fatal"})
	require.NoError(t, err)
	defer s.Close()
	c, err = clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	resp, err := c.Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "v", string(resp.Kvs[0].Value))
}

func TestStartRejectsNoDirectory(t *testing.T) {
	_, err := Start(context.Background(), Options{})
	require.Error(t, err)
}
