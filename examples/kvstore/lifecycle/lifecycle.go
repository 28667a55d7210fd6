// Package lifecycle runs the parts of an example binary (a node's client, its router, its
// HTTP server) as one: they start together, the first that fails stops the others, and Run
// returns once every one has returned.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sliceplane/sliceplane/client"
)

// Part is one of the things a binary runs until its context ends.
type Part struct {
	Name string
	Run  func(ctx context.Context) error
}

// Run runs parts until ctx ends or one of them fails, which cancels the others; it returns
// the first failure, named "<binary>: <part>: ...", or nil.
func Run(ctx context.Context, binary string, parts ...Part) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, p := range parts {
		g.Go(func() error {
			if err := p.Run(ctx); err != nil {
				return fmt.Errorf("%s: %s: %w", binary, p.Name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// HTTP serves srv on lis until ctx ends, then shuts it down, letting requests in flight
// finish for up to grace. With secure, it serves TLS with srv.TLSConfig (whose certificates
// are re-read when their files change). Requests get ctx as their base context, so that
// long ones end with the server.
func HTTP(ctx context.Context, srv *http.Server, lis net.Listener, secure bool, grace time.Duration) error {
	if srv.BaseContext == nil {
		srv.BaseContext = func(net.Listener) context.Context { return ctx }
	}
	served := make(chan error, 1)
	go func() {
		if secure {
			served <- srv.ServeTLS(lis, "", "")
			return
		}
		served <- srv.Serve(lis)
	}()
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		srv.Shutdown(sctx) //nolint:errcheck // requests cut short on the way out are no failure
		err = <-served
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Drained runs serve until ctx ends, then drain (on a context that outlives ctx), and only
// then stops serve: a process that hands its ranges over keeps serving them meanwhile. It
// returns serve's error, or nil; once serve has stopped by itself, drain is not called.
func Drained(ctx context.Context, serve func(context.Context) error, drain func(context.Context)) error {
	serving, stop := context.WithCancel(context.WithoutCancel(ctx))
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		select {
		case <-ctx.Done():
			drain(serving)
			stop()
		case <-serving.Done():
		}
	}()
	err := serve(serving)
	stop()
	<-drained
	return err
}

// Drainer hands a process's slices over before it stops: a client.Member or a client.Node.
type Drainer interface {
	Drain(ctx context.Context) error
	Slices() []client.Range
}

// DrainFor returns the drain of Drained for d: it drains for at most timeout, logging to
// log, and stops all the same if the drain does not finish. A timeout of 0 drains nothing:
// the process stops at once, as a crash would, its slices moving once its lease lapses. A
// drain with nowhere to go (client.ErrNowhereToDrain: no assigner runs, or no other node or
// member may take the slices) ends at once, and says so.
func DrainFor(d Drainer, timeout time.Duration, log *slog.Logger) func(context.Context) {
	return func(ctx context.Context) {
		if timeout <= 0 {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		held := len(d.Slices())
		log.Info("stopping: draining", "slices", held, "timeout", timeout)
		err := d.Drain(ctx)
		switch {
		case errors.Is(err, client.ErrNowhereToDrain):
			log.Warn("stopping without a drain: nowhere to hand the slices to; they move once the lease lapses",
				"slices", held, "err", err)
		case err != nil:
			log.Warn("the drain did not finish; stopping all the same", "err", err)
		}
	}
}
