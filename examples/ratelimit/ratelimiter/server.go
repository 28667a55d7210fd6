// Package ratelimiter is a member of the example rate limiter (examples/ratelimit): it embeds
// client.Member, keeps a token bucket per key in memory (Buckets, its client.Application)
// and serves the gRPC API ratelimit.v1.RateLimitService (Take on a key's primary, Peek on
// any replica) and the standard gRPC health service, over mutual TLS.
//
// Every call of the API runs through the member's interceptor
// (client.Member.UnaryServerInterceptor with KeyOf): a call for a key the member does not
// serve in the role it needs is answered NotOwner, and changed nothing; a caller that
// routes with client.GRPCDialOptions sends it again where its map says.
package ratelimiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/kvstore/lifecycle"
	ratelimitv1 "github.com/sliceplane/sliceplane/examples/ratelimit/proto/ratelimit/v1"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// Defaults of Config.
const (
	DefaultRate  = 10 // tokens a second
	DefaultBurst = 20
	DefaultRoles = client.RolesPrimarySecondary
)

// Config configures a member.
type Config struct {
	// ID names the member; keep it across restarts.
	ID string
	// Listen is the gRPC address to serve on; Advertise, where routers should send calls
	// (default: the bound address).
	Listen, Advertise string
	Assigners         []string
	// TLS gives the member its certificate (spiffe://sliceplane/node/<ID>): it serves over
	// TLS, requiring a client certificate from the same CA, and dials the assigners with it.
	// Without it the member serves plaintext, on loopback only unless TLS.Insecure.
	TLS mtls.Config
	// Roles is the cluster's role model, the assigners' --roles: DefaultRoles
	// (primary-secondary: a key's primary takes from its bucket) when empty; with
	// client.RolesReplicas every replica of a key keeps a bucket of its own.
	Roles string
	// Rate is how many tokens a second fill each key's bucket, up to Burst; DefaultRate and
	// DefaultBurst when zero.
	Rate, Burst float64
	// DrainTimeout bounds the drain when Run's context ends (SIGTERM): primaries demoted and
	// ranges handed over, make-before-break, while the member serves. Zero stops at once.
	DrainTimeout   time.Duration
	ReportInterval time.Duration
	// ConcurrentCalls is client.MemberConfig.ConcurrentCalls: 0 for the client's default.
	ConcurrentCalls int
	Logger          *slog.Logger
}

// Server is a running member.
type Server struct {
	cfg     Config
	log     *slog.Logger
	tls     *mtls.Source
	lis     net.Listener
	buckets *Buckets
	member  *client.Member
	grpc    *grpc.Server
	health  *health.Server
}

// stopGrace is how long the calls in flight may take to finish once the member stops.
const stopGrace = 5 * time.Second

// New binds the member's address and makes its member; Run serves.
func New(cfg Config) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	src, err := cfg.TLS.Load()
	if err != nil {
		return nil, fmt.Errorf("ratelimiter: %w", err)
	}
	if err := mtls.CheckListen(src, cfg.TLS.Insecure, "the rate limiter's gRPC API", cfg.Listen); err != nil {
		return nil, fmt.Errorf("ratelimiter: %w", err)
	}
	log := cfg.Logger.With("member", cfg.ID)
	buckets, err := NewBuckets(cfg.Rate, cfg.Burst, log)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("ratelimiter: listening on %s: %w", cfg.Listen, err)
	}
	if cfg.Advertise == "" {
		cfg.Advertise = lis.Addr().String()
	}
	member, err := client.NewMember(client.MemberConfig{ID: cfg.ID, Address: cfg.Advertise, Assigners: cfg.Assigners,
		TLS: client.TLS{Cert: cfg.TLS.Cert, Key: cfg.TLS.Key, CA: cfg.TLS.CA}, App: buckets, Roles: cfg.Roles,
		ReportInterval: cfg.ReportInterval, ConcurrentCalls: cfg.ConcurrentCalls, Logger: cfg.Logger})
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("ratelimiter: %w", err)
	}
	s := &Server{cfg: cfg, log: log, tls: src, lis: lis, buckets: buckets, member: member, health: health.NewServer()}
	s.grpc = grpc.NewServer(serverCreds(src), grpc.UnaryInterceptor(member.UnaryServerInterceptor(KeyOf)))
	ratelimitv1.RegisterRateLimitServiceServer(s.grpc, &service{id: cfg.ID, buckets: buckets, member: member})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.health.SetServingStatus(ratelimitv1.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// defaults fills in c's defaults and refuses what no member can run with.
func (c *Config) defaults() error {
	if c.Roles == "" {
		c.Roles = DefaultRoles
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	if c.DrainTimeout < 0 {
		return fmt.Errorf("ratelimiter: a negative drain timeout, %s", c.DrainTimeout)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// serverCreds returns the credentials of the member's gRPC server: a client certificate is
// required and verified in the handshake (any identity of the CA may call), or plaintext for
// a nil src.
func serverCreds(src *mtls.Source) grpc.ServerOption {
	if src == nil {
		return grpc.Creds(insecure.NewCredentials())
	}
	return grpc.Creds(credentials.NewTLS(src.ServerConfig()))
}

// Addr returns the bound address.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Run serves until ctx ends, drains (Config.DrainTimeout), then stops; it returns nil then,
// or the error that stopped the member. It runs once.
func (s *Server) Run(ctx context.Context) error {
	// The member and its API run on past ctx while it drains: serving is what lets its
	// ranges be handed over without a failed call.
	return lifecycle.Drained(ctx, s.serve, lifecycle.DrainFor(s.member, s.cfg.DrainTimeout, s.log))
}

func (s *Server) serve(ctx context.Context) error {
	return lifecycle.Run(ctx, "ratelimiter",
		lifecycle.Part{Name: "member", Run: s.member.Run},
		lifecycle.Part{Name: "grpc", Run: s.serveGRPC},
		lifecycle.Part{Name: "sweep", Run: s.sweep},
		lifecycle.Part{Name: "plaintext warning", Run: func(ctx context.Context) error {
			mtls.WarnPlaintext(ctx, s.log, s.tls, "the rate limiter's gRPC API", s.cfg.Listen)
			return nil
		}})
}

// serveGRPC serves the API until ctx ends, then says NOT_SERVING to health checks and
// lets the calls in flight finish, for up to stopGrace.
func (s *Server) serveGRPC(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- s.grpc.Serve(s.lis) }()
	select {
	case err := <-served: // only a failed listener ends Serve before Stop
		return err
	case <-ctx.Done():
	}
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		s.log.Warn("calls still in flight after the grace period; stopping all the same", "grace", stopGrace)
		s.grpc.Stop()
		<-stopped
	}
	if err := <-served; !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// sweep drops full buckets as often as an empty one takes to fill up (within a second and
// a minute), until ctx ends.
func (s *Server) sweep(ctx context.Context) error {
	t := time.NewTicker(min(max(s.buckets.RefillTime(), time.Second), time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.buckets.Sweep()
		}
	}
}
