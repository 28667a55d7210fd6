// Package countermember is a member of the example sharded counter (examples/counter): it
// embeds client.Member with primary and secondary roles, keeps its keys' counts in memory
// (Counts), and serves them over HTTP(S):
//
//	POST /v1/incr/KEY    the key's new count, {"key":"...","count":N}, on the key's primary
//	GET  /v1/count/KEY   the key's count, on any replica
//	GET  /healthz
//
// A request for a key the member does not serve in the needed role gets 421 Misdirected
// Request, and changed nothing: the proxy (client.Transport) sends it again elsewhere.
package countermember

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/fence"
	"github.com/sliceplane/sliceplane/examples/kvstore/lifecycle"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// Paths of the member's HTTP API.
const (
	IncrPath  = "/v1/incr/"
	CountPath = "/v1/count/"
)

// Config configures a member.
type Config struct {
	// ID names the member; keep it across restarts.
	ID string
	// Listen is the HTTP address to serve on; Advertise, where the proxy should send
	// requests (default: the bound address).
	Listen, Advertise string
	Assigners         []string
	// Target is the sharded service the member belongs to (client.MemberConfig.Target);
	// empty for the control plane's default target.
	Target string
	// DSN is the PostgreSQL connection string of the counters table (Schema).
	DSN string
	// TLS gives the member its certificate (spiffe://sliceplane/node/<ID>): it serves over
	// TLS with client certificates required and dials the assigners with it.
	TLS mtls.Config
	// DrainTimeout bounds the drain when Run's context ends (SIGTERM): primaries demoted and
	// ranges handed over, make-before-break, while the member serves.
	DrainTimeout   time.Duration
	ReportInterval time.Duration
	// WriteDelay is added to every increment's write (a slower database).
	WriteDelay time.Duration
	// Plain writes increments without the fence (client/fence): for a cluster that is not
	// exclusive, to show what a stale primary does without it.
	Plain  bool
	Logger *slog.Logger
}

// Server is a running member.
type Server struct {
	cfg    Config
	log    *slog.Logger
	tls    *mtls.Source
	lis    net.Listener
	pool   *pgxpool.Pool
	counts *Counts
	member *client.Member
}

// writeTimeout bounds one increment's write to PostgreSQL.
const writeTimeout = 2 * time.Second

// New connects to PostgreSQL, binds the member's address and makes its member; Run serves.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	src, err := cfg.TLS.Load()
	if err != nil {
		return nil, fmt.Errorf("countermember: %w", err)
	}
	if err := mtls.CheckListen(src, cfg.TLS.Insecure, "the counter's HTTP API", cfg.Listen); err != nil {
		return nil, fmt.Errorf("countermember: %w", err)
	}
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("countermember: connecting to PostgreSQL: %w", err)
	}
	if _, err := pool.Exec(ctx, Schema+fence.PGSchema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("countermember: creating the counters table: %w", err)
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("countermember: listening on %s: %w", cfg.Listen, err)
	}
	if cfg.Advertise == "" {
		cfg.Advertise = lis.Addr().String()
	}
	counts := NewCounts(pool, cfg.WriteDelay, !cfg.Plain, cfg.Logger.With("member", cfg.ID))
	member, err := client.NewMember(client.MemberConfig{ID: cfg.ID, Address: cfg.Advertise, Assigners: cfg.Assigners, Target: cfg.Target,
		TLS: client.TLS{Cert: cfg.TLS.Cert, Key: cfg.TLS.Key, CA: cfg.TLS.CA}, App: counts, Roles: client.RolesPrimarySecondary,
		ReportInterval: cfg.ReportInterval, Logger: cfg.Logger})
	if err != nil {
		lis.Close()
		pool.Close()
		return nil, fmt.Errorf("countermember: %w", err)
	}
	return &Server{cfg: cfg, log: cfg.Logger.With("member", cfg.ID), tls: src, lis: lis, pool: pool, counts: counts, member: member}, nil
}

// Addr returns the bound address.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Run serves until ctx ends, drains (Config.DrainTimeout), then stops; it returns nil then,
// or the error that stopped the member. It runs once.
func (s *Server) Run(ctx context.Context) error {
	defer s.pool.Close()
	// The member and its HTTP API run on past ctx while it drains: serving is what lets its
	// ranges be handed over without a failed request.
	return lifecycle.Drained(ctx, s.serve, lifecycle.DrainFor(s.member, s.cfg.DrainTimeout, s.log))
}

func (s *Server) serve(ctx context.Context) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second, TLSConfig: s.tls.ServerTLS()}
	return lifecycle.Run(ctx, "countermember",
		lifecycle.Part{Name: "member", Run: s.member.Run},
		lifecycle.Part{Name: "http", Run: func(ctx context.Context) error {
			return lifecycle.HTTP(ctx, srv, s.lis, s.tls != nil, 5*time.Second)
		}})
}

// MemberHeader names the member that answered.
const MemberHeader = "Sliceplane-Member"

// Result is the answer to an increment or a read.
type Result struct {
	Key   string `json:"key"`
	Count int64  `json:"count"`
}

// Handler returns the member's HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+IncrPath+"{key...}", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		ctx, cancel := context.WithTimeout(client.HTTPContext(r), writeTimeout)
		defer cancel()
		var n int64
		err := s.member.Write(ctx, []byte(key), func(g client.Grant) (err error) {
			n, err = s.counts.Incr(ctx, key, g)
			return err
		})
		s.answer(w, key, n, err)
	})
	mux.HandleFunc("GET "+CountPath+"{key...}", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		var n int64
		err := s.member.Read(client.HTTPContext(r), []byte(key), func(g client.Grant) (err error) {
			n, err = s.counts.Get(r.Context(), key, g)
			return err
		})
		s.answer(w, key, n, err)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

// answer writes a request's outcome: the count, 421 when the member does not serve the key
// now (nothing changed), 409 when the fence refused the write (nothing changed: another
// member is the key's primary now), 503 when PostgreSQL failed (an increment may have been
// written).
func (s *Server) answer(w http.ResponseWriter, key string, n int64, err error) {
	switch {
	case errors.Is(err, client.ErrNotOwner):
		http.Error(w, err.Error(), http.StatusMisdirectedRequest)
		return
	case errors.Is(err, ErrFenced):
		s.log.Warn("the fence refused an increment: another member is the key's primary now", "key", key, "err", err)
		http.Error(w, err.Error(), http.StatusConflict)
		return
	case err != nil:
		s.log.Warn("request failed", "key", key, "err", err)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	s.member.RecordLoad([]byte(key), 1)
	w.Header().Set(MemberHeader, s.cfg.ID)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(Result{Key: key, Count: n}) //nolint:errcheck // the client went away
}
