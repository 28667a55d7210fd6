// Package embedetcd runs a single-member etcd inside the process: the zero-setup default of
// the assigner, and the etcd of tests. It listens on loopback only.
package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync/atomic"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/sliceplane/sliceplane/internal/etcdlog"

	"go.etcd.io/etcd/server/v3/embed"
)

// Options shape the embedded server.
type Options struct {
	// Dir holds the data. Required.
	Dir string
	// ClientAddr is the host:port clients connect to; "127.0.0.1:0" (the default) picks a free
	// port.
	ClientAddr string
	// Fast trades durability for speed (no fsync, 10 ms ticks): for tests only, never for
	// data that matters.
	Fast bool
	// MaxRequestBytes caps one request; 0 keeps etcd's default, 1.5 MiB.
	MaxRequestBytes uint
	// LogLevel is etcd's log level; "" means "error" (etcd warns about every single-member
	// loopback setup, which is what this is).
	LogLevel string
	// Logger receives etcd's logs; default slog.Default().
	Logger *slog.Logger
	// ReadyTimeout bounds the wait for the server to serve; 0 means 30 s.
	ReadyTimeout time.Duration
}

// Server is a running embedded etcd.
type Server struct {
	etcd     *embed.Etcd
	endpoint string
	closing  *atomic.Bool
}

// Start starts the server and waits until it serves, or ctx ends, or ReadyTimeout passes.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Dir == "" {
		return nil, errors.New("embedetcd: no data directory")
	}
	cfg := embed.NewConfig()
	cfg.Dir = o.Dir
	cfg.Name = "sliceplane"
	client := o.ClientAddr
	if client == "" {
		client = "127.0.0.1:0"
	}
	cu, err := url.Parse("http://" + client)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: client address %q: %w", client, err)
	}
	pu, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = o.LogLevel
	if cfg.LogLevel == "" {
		cfg.LogLevel = "error"
	}
	level, err := zapcore.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: log level %q: %w", cfg.LogLevel, err)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	closing := &atomic.Bool{}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdlog.New(o.Logger, level, closing))
	if o.MaxRequestBytes > 0 {
		cfg.MaxRequestBytes = o.MaxRequestBytes
	}
	if o.Fast {
		cfg.UnsafeNoFsync = true
		cfg.TickMs, cfg.ElectionMs = 10, 100
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: starting in %s: %w", o.Dir, err)
	}
	timeout := o.ReadyTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedetcd: failed to start: %w", err)
	case <-timer.C:
		e.Close()
		return nil, fmt.Errorf("embedetcd: not ready after %s", timeout)
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
	return &Server{etcd: e, endpoint: "http://" + e.Clients[0].Addr().String(), closing: closing}, nil
}

// Endpoint returns the URL clients connect to, with the port actually bound.
func (s *Server) Endpoint() string { return s.endpoint }

// Err reports a fatal error of the running server.
func (s *Server) Err() <-chan error { return s.etcd.Err() }

// Close stops the server and waits for it to release its data directory.
func (s *Server) Close() {
	s.closing.Store(true)
	s.etcd.Close()
}
