// Package etcdtest starts an embedded etcd for a test, on loopback, in the test's temporary
// directory, fast and not durable, and stops it when the test ends.
package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sliceplane/sliceplane/internal/embedetcd"
)

// Start starts an embedded etcd for t and returns it; it is closed when t ends.
func Start(t testing.TB) *embedetcd.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := embedetcd.Start(ctx, embedetcd.Options{Dir: t.TempDir(), Fast: true, LogLevel: "fatal"})
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Client returns a client of s, closed when t ends.
func Client(t testing.TB, s *embedetcd.Server) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// New starts an embedded etcd for t and returns a client of it.
func New(t testing.TB) *clientv3.Client {
	t.Helper()
	return Client(t, Start(t))
}
