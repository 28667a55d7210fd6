// Package metricsserver serves a Prometheus registry at /metrics on a listener of its own, as
// every Sliceplane process does next to its gRPC port.
package metricsserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// shutdownTimeout bounds how long Serve waits for scrapes in flight when it stops.
const shutdownTimeout = 5 * time.Second

// Server is a bound metrics endpoint. A nil *Server is one that was not asked for: it has no
// address and serves nothing.
type Server struct {
	lis  net.Listener
	http *http.Server
}

// Page is more that the endpoint serves beside /metrics: Handler under Path (a pattern of
// http.ServeMux, such as "/ui/"). It guards itself (authz.Authorizer.HTTP).
type Page struct {
	Path    string
	Handler http.Handler
}

// Listen binds addr and prepares to serve reg at /metrics, and pages, over TLS when tlsConf is
// not nil (mtls.Source.ServerTLS: clients then need a client certificate from the CA); the
// handler counts its own errors in reg too, and the server's go to log (nil: the standard
// logger). An empty addr asks for no endpoint: Listen returns nil, nil.
func Listen(addr string, reg *prometheus.Registry, tlsConf *tls.Config, log *slog.Logger, pages ...Page) (*Server, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listening on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	for _, p := range pages {
		mux.Handle(p.Path, p.Handler)
	}
	if tlsConf != nil {
		lis = tls.NewListener(lis, tlsConf)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	if log != nil {
		srv.ErrorLog = stdlog.New(serverErrors{log}, "", 0)
	}
	return &Server{lis: lis, http: srv}, nil
}

// serverErrors writes what net/http logs to a structured log: a client refused at the TLS
// handshake (one without a certificate, a scanner) at debug, as it is the listener doing its
// job; anything else, such as a handler's panic, as a warning.
type serverErrors struct{ log *slog.Logger }

func (e serverErrors) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelWarn
	if strings.Contains(msg, "TLS handshake error") {
		level = slog.LevelDebug
	}
	e.log.Log(context.Background(), level, "metrics: http server", "err", msg)
	return len(p), nil
}

// Addr returns the bound address, or "" for a nil Server.
func (s *Server) Addr() string {
	if s == nil {
		return ""
	}
	return s.lis.Addr().String()
}

// Close releases the listener of a Server that will not Serve.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	return s.lis.Close()
}

// Serve serves until ctx ends, then shuts down, letting scrapes in flight finish for a
// while; it returns nil then, or the error that stopped it earlier. A nil Server returns nil
// at once.
func (s *Server) Serve(ctx context.Context) error {
	if s == nil {
		return nil
	}
	// Requests see ctx end: a page's long-lived stream then ends, and does not hold up the
	// shutdown.
	s.http.BaseContext = func(net.Listener) context.Context { return ctx }
	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(stopped)
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		s.http.Shutdown(sctx) //nolint:errcheck // a scrape cut short is no failure
	})
	err := s.http.Serve(s.lis)
	if !stop() {
		<-stopped // the shutdown began: it owns the connections until it is done
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("metrics: serving on %s: %w", s.Addr(), err)
}
