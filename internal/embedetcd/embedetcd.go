// Package embedetcd runs a single-member etcd inside the process: the zero-setup default of
// the assigner, and the etcd of tests. It listens on loopback by default; given TLS files it
// serves its clients over mutual TLS (https), so that only holders of a certificate from the
// CA reach the cluster's state, and it refuses a non-loopback address without them unless
// told it may (closed by default, as every Sliceplane server). Tests of what survives losing
// etcd members run a cluster of several members in the process (StartCluster).
package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"

	"github.com/sliceplane/sliceplane/internal/etcdlog"
	"github.com/sliceplane/sliceplane/internal/mtls"
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
	// TickMs and ElectionMs, if set, replace etcd's heartbeat interval and election timeout
	// (Fast's too): a cluster test that kills its leader wants elections of realistic length.
	TickMs, ElectionMs uint
	// MaxRequestBytes caps one request; 0 keeps etcd's default, 1.5 MiB.
	MaxRequestBytes uint
	// LogLevel is etcd's log level; "" means "error" (etcd warns about every single-member
	// loopback setup, which is what this is).
	LogLevel string
	// Logger receives etcd's logs; default slog.Default().
	Logger *slog.Logger
	// ReadyTimeout bounds the wait for the server to serve; 0 means 30 s.
	ReadyTimeout time.Duration
	// TLS, when it names files, makes the client URL https and requires every client to
	// present a certificate from TLS.CA; the server presents TLS.Cert. TLS.Insecure lets
	// ClientAddr be a non-loopback address without files. (Start only; clusters are for
	// tests on loopback.)
	TLS mtls.Config
}

// Server is a running embedded etcd.
type Server struct {
	etcd     *embed.Etcd
	endpoint string
	closing  *atomic.Bool
	once     sync.Once
}

// Start starts the server and waits until it serves, or ctx ends, or ReadyTimeout passes.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Dir == "" {
		return nil, errors.New("embedetcd: no data directory")
	}
	client := o.ClientAddr
	if client == "" {
		client = "127.0.0.1:0"
	}
	src, err := o.TLS.Load()
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %w", err)
	}
	if err := mtls.CheckListen(src, o.TLS.Insecure, "the embedded etcd", client); err != nil {
		return nil, fmt.Errorf("embedetcd: %w", err)
	}
	scheme := "http"
	if src != nil {
		scheme = "https"
	}
	cu, err := url.Parse(scheme + "://" + client)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: client address %q: %w", client, err)
	}
	pu, _ := url.Parse(scheme + "://127.0.0.1:0")
	cfg, closing, err := config(o, "sliceplane", o.Dir, *cu, *pu)
	if err != nil {
		return nil, err
	}
	if src != nil {
		// The peer URL too, though a single member has no peer: nothing on the host should
		// speak raft to it without a certificate.
		info := transport.TLSInfo{CertFile: o.TLS.Cert, KeyFile: o.TLS.Key, TrustedCAFile: o.TLS.CA, ClientCertAuth: true}
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = info, info
	}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: starting in %s: %w", o.Dir, err)
	}
	if err := ready(ctx, e, o.ReadyTimeout); err != nil {
		return nil, err
	}
	return &Server{etcd: e, endpoint: scheme + "://" + e.Clients[0].Addr().String(), closing: closing}, nil
}

// config returns the configuration of member name, and the flag that quiets its logs once
// it is being closed.
func config(o Options, name, dir string, client, peer url.URL) (*embed.Config, *atomic.Bool, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = name
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.LogLevel = o.LogLevel
	if cfg.LogLevel == "" {
		cfg.LogLevel = "error"
	}
	level, err := zapcore.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, nil, fmt.Errorf("embedetcd: log level %q: %w", cfg.LogLevel, err)
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
	if o.TickMs > 0 {
		cfg.TickMs = o.TickMs
	}
	if o.ElectionMs > 0 {
		cfg.ElectionMs = o.ElectionMs
	}
	return cfg, closing, nil
}

// ready waits until e serves; it closes e if e does not.
func ready(ctx context.Context, e *embed.Etcd, timeout time.Duration) error {
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("embedetcd: failed to start: %w", err)
	case <-timer.C:
		e.Close()
		return fmt.Errorf("embedetcd: not ready after %s", timeout)
	case <-ctx.Done():
		e.Close()
		return ctx.Err()
	}
}

// Endpoint returns the URL clients connect to, with the port actually bound.
func (s *Server) Endpoint() string { return s.endpoint }

// Err reports a fatal error of the running server.
func (s *Server) Err() <-chan error { return s.etcd.Err() }

// Close stops the server and waits for it to release its data directory. Closing it again
// does nothing.
func (s *Server) Close() {
	s.once.Do(func() {
		s.closing.Store(true)
		s.etcd.Close()
	})
}

// Kill stops the server as a crash would, without handing its raft leadership over first
// (Close does, which spares the cluster an election), then releases it as Close does.
func (s *Server) Kill() {
	s.once.Do(func() {
		s.closing.Store(true)
		s.etcd.Server.HardStop()
		s.etcd.Close()
	})
}

// Leads reports whether the server, still running, is its cluster's raft leader.
func (s *Server) Leads() bool {
	return !s.closing.Load() && s.etcd.Server.Leader() == s.etcd.Server.MemberID()
}

// Cluster is a multi-member etcd in the process, on loopback.
type Cluster struct {
	Members []*Server
	cfgs    []*embed.Config // to restart members
	opts    Options
}

// StartCluster starts a cluster of n members in subdirectories of o.Dir, with clients on
// free loopback ports (o.ClientAddr is not used), and waits until every member serves.
func StartCluster(ctx context.Context, o Options, n int) (*Cluster, error) {
	if o.Dir == "" || n < 1 {
		return nil, errors.New("embedetcd: a cluster needs a data directory and members")
	}
	// The initial cluster names every member's peer address before any starts: reserve ports.
	addrs, err := freeAddrs(2 * n)
	if err != nil {
		return nil, err
	}
	var cfgs []*embed.Config
	var closings []*atomic.Bool
	var initial []string
	for i := range n {
		name := fmt.Sprintf("m%d", i)
		cfg, closing, err := config(o, name, filepath.Join(o.Dir, name),
			url.URL{Scheme: "http", Host: addrs[2*i]}, url.URL{Scheme: "http", Host: addrs[2*i+1]})
		if err != nil {
			return nil, err
		}
		cfgs, closings = append(cfgs, cfg), append(closings, closing)
		initial = append(initial, name+"=http://"+addrs[2*i+1])
	}
	c := &Cluster{cfgs: cfgs, opts: o}
	for i, cfg := range cfgs {
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = "sliceplane-test"
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("embedetcd: starting member %s: %w", cfg.Name, err)
		}
		c.Members = append(c.Members, &Server{etcd: e, endpoint: "http://" + e.Clients[0].Addr().String(), closing: closings[i]})
	}
	for _, m := range c.Members {
		if err := ready(ctx, m.etcd, o.ReadyTimeout); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Restart starts member i again, from its data, on the same addresses (after Close), and
// waits until it serves.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	old := c.cfgs[i]
	cfg, closing, err := config(c.opts, old.Name, old.Dir, old.ListenClientUrls[0], old.ListenPeerUrls[0])
	if err != nil {
		return err
	}
	cfg.InitialCluster, cfg.InitialClusterToken = old.InitialCluster, old.InitialClusterToken
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("embedetcd: restarting member %s: %w", cfg.Name, err)
	}
	if err := ready(ctx, e, c.opts.ReadyTimeout); err != nil {
		return err
	}
	c.Members[i] = &Server{etcd: e, endpoint: "http://" + e.Clients[0].Addr().String(), closing: closing}
	return nil
}

// freeAddrs returns n loopback addresses whose ports were free a moment ago.
func freeAddrs(n int) ([]string, error) {
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("embedetcd: reserving a port: %w", err)
		}
		out = append(out, l.Addr().String())
		l.Close()
	}
	return out, nil
}

// Endpoints returns the client URLs of every member.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.Endpoint())
	}
	return out
}

// Leader returns the running member that leads, or nil while none does.
func (c *Cluster) Leader() *Server {
	for _, m := range c.Members {
		if m.Leads() {
			return m
		}
	}
	return nil
}

// Close stops every member.
func (c *Cluster) Close() {
	for _, m := range c.Members {
		m.Close()
	}
}
