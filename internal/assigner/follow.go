package assigner

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/sliceplane/sliceplane/internal/source"
)

// How the leader waits for a source it lost: from the first retry to the longest wait
// between two, so that it follows the source again within about a second of its return.
const (
	minSourceBackoff = 50 * time.Millisecond
	maxSourceBackoff = time.Second
	// sourceReadTimeout bounds one clock read: a source that drops every packet must not
	// hold the leader's takeover, or the follower, for long.
	sourceReadTimeout = 2 * time.Second
)

// followSource follows the source's clock for the leader's loop until ctx ends, on the
// goroutine the loop starts for it, and sends what it learns as core events: ClockObserved
// as the clock moves, SourceLost when a watch ends or a clock read fails. Once lost, it reads
// the clock again, backing off from minSourceBackoff to maxSourceBackoff, and watches from
// where the source answers. from is the clock to watch from, 0 if unknown (it is read first).
//
// Only the source's errors reach the core: leadership does not depend on the source.
func (s *served) followSource(ctx context.Context, log *slog.Logger, from uint64, out chan<- core.Event) {
	f := &follower{s: s, log: log, out: out, backoff: minSourceBackoff}
	for ctx.Err() == nil {
		if from == 0 {
			clock, err := s.readClock(ctx)
			if err != nil {
				if !f.failed(ctx, err) {
					return
				}
				continue
			}
			if !f.send(ctx, core.ClockObserved{Clock: clock}) {
				return
			}
			from = clock
		}
		if !f.watch(ctx, &from) {
			return
		}
		from = 0 // a watch that ended: where the source stands is read again first
	}
}

// follower is the state of followSource between its steps.
type follower struct {
	s       *served
	log     *slog.Logger
	out     chan<- core.Event
	backoff time.Duration
	lost    bool // SourceLost was sent, and no clock since
	errs    int  // failed attempts in a row
}

// readClock reads the source's clock, bounded by sourceReadTimeout.
func (s *served) readClock(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, sourceReadTimeout)
	defer cancel()
	return s.source.Clock(ctx)
}

// watch runs one watch from *from, sending the clocks it delivers, until it ends; it
// reports false once ctx ended.
func (f *follower) watch(ctx context.Context, from *uint64) bool {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for b := range f.s.watchClock(wctx, *from) {
		switch {
		case b.Err != nil:
			// Said at once: a clock read right after would wait out the source's timeout
			// again, and the operator would learn of the outage later.
			f.ended(b.Err)
			return f.send(ctx, f.s.sourceLost(b.Err))
		case len(b.Changes) > 0 || f.s.clockOnly || f.lost:
			// Progress marks of a change watch (asked for by a distributor sharing this etcd
			// client) would do too, but a clock quantum for each would invite the next
			// request; after a loss, any batch says the source answers.
			if !f.send(ctx, core.ClockObserved{Clock: b.Clock}) {
				return false
			}
			*from = max(*from, b.Clock)
		}
	}
	return ctx.Err() == nil
}

// ended logs a watch that ended (at info if the source ended it in order, a database
// shutting down; the core logs the outage) and counts it.
func (f *follower) ended(err error) {
	if errors.Is(err, source.ErrEnded) {
		f.log.Info("the source ended its watch; following it again", "err", err)
	} else {
		f.log.Debug("the source watch failed; following it again", "err", err)
	}
	f.s.metrics.source.Failed(err)
}

// failed reports a failed clock read to the loop as SourceLost (the core logs a loss once,
// and again if its class changes), and waits for the backoff before the next read. It
// reports false once ctx ended.
func (f *follower) failed(ctx context.Context, err error) bool {
	f.s.metrics.source.Failed(err)
	f.errs++
	f.log.Debug("reading the source's clock failed", "err", err, "attempt", f.errs, "retry_in", f.backoff)
	if !f.send(ctx, f.s.sourceLost(err)) {
		return false
	}
	select {
	case <-time.After(f.backoff):
	case <-ctx.Done():
		return false
	}
	f.backoff = min(2*f.backoff, maxSourceBackoff)
	return true
}

// send hands ev to the loop. A clock ends a loss and its backoff.
func (f *follower) send(ctx context.Context, ev core.Event) bool {
	select {
	case f.out <- ev:
	case <-ctx.Done():
		return false
	}
	switch ev.(type) {
	case core.ClockObserved:
		f.lost, f.errs, f.backoff = false, 0, minSourceBackoff
	case core.SourceLost:
		f.lost = true
	}
	return true
}
