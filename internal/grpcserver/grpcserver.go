// Package grpcserver serves a Sliceplane gRPC API the way every Sliceplane server does: on a
// listener of its own, with the keepalive, frame codec and authorization (package authz) of
// the project, the standard health service and reflection, and Prometheus metrics on a
// second listener (package metricsserver), both behind the same mutual TLS (package mtls).
//
// A server (the assigner, the distributor) checks its addresses with CheckListen in its
// Config.Validate, makes a Server with New, registers its services on it, and hands Run the
// work that is its own (campaigning, routing); Run serves until its context ends and then
// stops everything it started.
package grpcserver

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/frame"
	"github.com/sliceplane/sliceplane/internal/metricsserver"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// Config configures a Server. Its owner validates and defaults it (CheckListen, a logger, a
// registry) before New.
type Config struct {
	// Name names the server ("assigner"): its errors and log lines start with it, its
	// refused calls are counted in sliceplane_<Name>_requests_denied_total.
	Name string
	// Listen is the gRPC address; Advertise the address others dial, default the bound one.
	Listen, Advertise string
	// MetricsListen serves Registry at /metrics, and Pages; "" serves none.
	MetricsListen string
	// Pages are served beside /metrics, each to the callers with its Role (see
	// authz.Authorizer.HTTP): the assigner's web view.
	Pages []Page
	// MaxRecvBytes caps a request; 0 keeps gRPC's default (4 MiB).
	MaxRecvBytes int
	// Rules and Policy decide who may call what (package authz).
	Rules  authz.Rules
	Policy *authz.Policy
	// TLS secures both endpoints; nil serves plaintext, with a warning in the log.
	TLS      *mtls.Source
	Registry *prometheus.Registry
	Logger   *slog.Logger
	// Grace bounds how long Run lets the calls in flight finish once its context ended and
	// its tasks returned. Zero cuts them at once, without waiting for the tasks: for a
	// server whose streams never end on their own.
	Grace time.Duration
}

// Page is a handler the metrics listener serves under Path to the callers with Role.
type Page struct {
	Path    string
	Role    authz.Role
	Handler http.Handler
}

// CheckListen refuses addresses a server named name cannot listen on: one that is no
// host:port, or plaintext off loopback without insecure (mtls.CheckListen). Its errors name
// the flags, --listen and --metrics-listen, that set them in every command.
func CheckListen(name string, src *mtls.Source, insecure bool, listen, metricsListen string) error {
	for _, l := range []struct{ flag, what, addr string }{
		{"--listen", "the " + name + "'s gRPC API", listen},
		{"--metrics-listen", "the " + name + "'s metrics", metricsListen},
	} {
		if l.addr == "" && l.flag == "--metrics-listen" {
			continue
		}
		if _, _, err := net.SplitHostPort(l.addr); err != nil {
			return fmt.Errorf("%s: %s: %w", name, l.flag, err)
		}
		if err := mtls.CheckListen(src, insecure, l.what, l.addr); err != nil {
			return fmt.Errorf("%s: %s: %w", name, l.flag, err)
		}
	}
	return nil
}

// Server is a bound gRPC API with its health, reflection and metrics endpoints. Services are
// registered on it (it is a grpc.ServiceRegistrar) before Run.
type Server struct {
	cfg    Config
	log    *slog.Logger
	grpc   *grpc.Server
	health *health.Server
	lis    net.Listener
	scrape *metricsserver.Server // nil without MetricsListen
}

// tlsReadBuffer is the read buffer of a server over TLS: none. The server reads its frames
// straight from the TLS connection, which already holds whole records, not through 32 KiB
// of its own per connection. That buffer was half of a relay's memory per watcher (issue
// 24's benchmark: 153 KB of heap per watcher, both ends of each stream, against 79 KB
// without). Plaintext servers keep it: without it they make a read call per frame header.
const tlsReadBuffer = 0

// New binds cfg.Listen and cfg.MetricsListen and prepares the gRPC server, with the health
// service (every service SERVING, see Health) and reflection registered.
func New(cfg Config) (*Server, error) {
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("%s: listening on %s: %w", cfg.Name, cfg.Listen, err)
	}
	if cfg.Advertise == "" {
		cfg.Advertise = lis.Addr().String()
	}
	opts := dial.ServerOptions()
	if cfg.TLS != nil {
		opts = append(opts, grpc.ReadBufferSize(tlsReadBuffer))
	}
	if cfg.MaxRecvBytes > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(cfg.MaxRecvBytes))
	}
	opts = append(opts, frame.ServerOption())
	az := authz.New(cfg.Name, cfg.TLS, cfg.Policy, cfg.Rules, cfg.Registry, cfg.Logger)
	s := &Server{
		cfg: cfg, log: cfg.Logger, lis: countConnections(lis, cfg.Name, cfg.Registry),
		grpc:   grpc.NewServer(append(opts, az.ServerOptions()...)...),
		health: health.NewServer(),
	}
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	var pages []metricsserver.Page
	for _, p := range cfg.Pages {
		pages = append(pages, metricsserver.Page{Path: p.Path, Handler: az.HTTP(p.Path, p.Role, p.Handler)})
	}
	if s.scrape, err = metricsserver.Listen(cfg.MetricsListen, cfg.Registry, cfg.TLS.ServerTLS(), cfg.Logger, pages...); err != nil {
		lis.Close()
		return nil, fmt.Errorf("%s: %w", cfg.Name, err)
	}
	return s, nil
}

// RegisterService registers a service before Run, as generated Register functions do.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.grpc.RegisterService(desc, impl)
}

// GetServiceInfo returns the services registered, health and reflection included.
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo { return s.grpc.GetServiceInfo() }

// Health returns the health service, for the server to set the status of services of its
// own (such as the assigner's leader service).
func (s *Server) Health() *health.Server { return s.health }

// Addr returns the address the gRPC server listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Advertise returns the address others should dial: Config.Advertise, or the bound one.
func (s *Server) Advertise() string { return s.cfg.Advertise }

// MetricsAddr returns the address of the metrics endpoint, or "".
func (s *Server) MetricsAddr() string { return s.scrape.Addr() }

// Task is work a server runs beside its API, from Run: it returns when its context ends, an
// error earlier if it cannot go on.
type Task struct {
	Name string // says what failed: "routing"
	Run  func(context.Context) error
}

// Run serves the API and the metrics and runs the tasks until ctx ends or one of them fails,
// whose error it returns (prefixed by the server's name and the task's). Then it stops them
// all: the metrics endpoint and the tasks at once; the calls in flight once the tasks have
// returned, within Config.Grace. It logs "<Name> serving" when it starts and
// "<Name> stopped" when everything has.
func (s *Server) Run(ctx context.Context, tasks ...Task) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(tasks)+2)
	var serving, working sync.WaitGroup
	spawn := func(wg *sync.WaitGroup, t Task) {
		wg.Go(func() {
			if err := t.Run(ctx); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("%s: %s: %w", s.cfg.Name, t.Name, err)
			}
		})
	}
	spawn(&serving, Task{"serving gRPC", func(context.Context) error { return s.grpc.Serve(s.lis) }})
	spawn(&serving, Task{"serving metrics", s.scrape.Serve})
	for _, ep := range []struct{ what, addr string }{{"grpc", s.Addr()}, {"metrics", s.MetricsAddr()}} {
		if ep.addr != "" {
			serving.Go(func() { mtls.WarnPlaintext(ctx, s.log, s.cfg.TLS, ep.what, ep.addr) })
		}
	}
	s.log.Info(s.cfg.Name+" serving", "grpc", s.Addr(), "metrics", s.MetricsAddr(), "advertise", s.cfg.Advertise, "tls", s.cfg.TLS.Mode())
	for _, t := range tasks {
		spawn(&working, t)
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	cancel()
	if s.cfg.Grace <= 0 {
		s.grpc.Stop()
	}
	// The tasks may own what ends the calls in flight (the assigner's leadership ends its
	// streams): they return before the calls are given their grace.
	working.Wait()
	if s.cfg.Grace > 0 {
		s.stop()
	}
	serving.Wait()
	s.log.Info(s.cfg.Name + " stopped")
	return err
}

// stop lets the calls in flight finish within the grace, then cuts the rest.
func (s *Server) stop() {
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	t := time.NewTimer(s.cfg.Grace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		s.grpc.Stop()
		<-stopped
	}
}
