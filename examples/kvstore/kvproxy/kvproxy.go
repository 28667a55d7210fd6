// Package kvproxy is the example key-value store's router: an HTTP front that sends each
// read to a replica of the key's slice, found with client.Router and chosen by its policy.
package kvproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/lifecycle"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// Config configures a Proxy.
type Config struct {
	Listen    string
	Assigners []string
	Policy    client.Policy
	// TLS gives the proxy its certificate (a router's): it serves over TLS with client
	// certificates required, dials the assigners with it and reads from the nodes with it.
	// The zero TLS is plaintext, allowed on loopback or with Insecure.
	TLS    mtls.Config
	Logger *slog.Logger
}

// Proxy is a running router.
type Proxy struct {
	log    *slog.Logger
	tls    *mtls.Source
	lis    net.Listener
	router *client.Router
	nodes  *kvclient.Pool
}

// New binds the proxy's address; Run serves.
func New(cfg Config) (*Proxy, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	src, err := cfg.TLS.Load()
	if err != nil {
		return nil, fmt.Errorf("kvproxy: %w", err)
	}
	if err := mtls.CheckListen(src, cfg.TLS.Insecure, "the proxy", cfg.Listen); err != nil {
		return nil, fmt.Errorf("kvproxy: %w", err)
	}
	router, err := client.NewRouter(client.RouterConfig{Assigners: cfg.Assigners, Policy: cfg.Policy, Logger: cfg.Logger,
		TLS: client.TLS{Cert: cfg.TLS.Cert, Key: cfg.TLS.Key, CA: cfg.TLS.CA}})
	if err != nil {
		return nil, fmt.Errorf("kvproxy: %w", err)
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("kvproxy: listening on %s: %w", cfg.Listen, err)
	}
	return &Proxy{log: cfg.Logger, tls: src, lis: lis, router: router, nodes: kvclient.NewPool(kvclient.HTTPClient(src, 5*time.Second))}, nil
}

// Addr returns the bound address.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Run serves until ctx ends; it returns nil then.
func (p *Proxy) Run(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+kvclient.KeyPath+"{key...}", p.serveKey)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, TLSConfig: p.tls.ServerTLS()}
	p.log.Info("serving", "addr", p.Addr(), "tls", p.tls.Mode())
	return lifecycle.Run(ctx, "kvproxy",
		lifecycle.Part{Name: "router", Run: p.router.Run},
		lifecycle.Part{Name: "http", Run: func(ctx context.Context) error {
			return lifecycle.HTTP(ctx, srv, p.lis, p.tls != nil, 5*time.Second)
		}},
		lifecycle.Part{Name: "plaintext warning", Run: func(ctx context.Context) error {
			mtls.WarnPlaintext(ctx, p.log, p.tls, "the proxy", p.Addr())
			return nil
		}},
	)
}

func (p *Proxy) serveKey(w http.ResponseWriter, r *http.Request) {
	v, clock, rep, _, err := p.nodes.Read(r.Context(), p.router, []byte(r.PathValue("key")))
	switch {
	case err == nil:
		w.Header().Set(kvclient.ClockHeader, strconv.FormatUint(clock, 10))
		w.Header().Set("Sliceplane-Node", rep.ID)
		w.Write(v) //nolint:errcheck // the client went away
	case errors.Is(err, client.ErrNotReady):
		http.Error(w, "kvproxy: "+err.Error(), http.StatusServiceUnavailable)
	case errors.Is(err, kvclient.ErrNotFound):
		http.Error(w, "kvproxy: no such key", http.StatusNotFound)
	default:
		p.log.Warn("read failed", "node", rep.ID, "err", err)
		http.Error(w, "kvproxy: "+err.Error(), http.StatusBadGateway)
	}
}
