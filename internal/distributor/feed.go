package distributor

import (
	"context"
	"errors"
	"time"

	"github.com/sliceplane/sliceplane/internal/source"
)

// How the feed waits for a source it lost, from the first retry to the longest wait
// between two: within about a second of the source's return, the watch runs again.
const (
	minWatchBackoff = 50 * time.Millisecond
	maxWatchBackoff = time.Second
	// maxMisconfiguredBackoff is the longest wait for a source that cannot be watched as
	// configured: each attempt logs an error.
	maxMisconfiguredBackoff = 10 * time.Second
	// livenessAsk is how long a feed may hear nothing before it asks the source for
	// progress: a reachable source answers with a mark (and the PostgreSQL source sends one
	// every status interval unasked), so that the nodes can tell an idle source from one
	// their distributor cannot reach.
	livenessAsk = 250 * time.Millisecond
	// clockReadTimeout bounds the clock read of a rebase.
	clockReadTimeout = 2 * time.Second
	// silenceLimit is how long a watch may say nothing, though asked for progress every
	// livenessAsk, before the source counts as unavailable: an etcd client retries a lost
	// link by itself, and its watch only goes quiet.
	silenceLimit = 2 * time.Second
)

// sourceFeed is the distributor's watch of its source, owned by the route loop. A watch that
// fails is started again from the clock the sequencer has seen, after a backoff that grows
// while the source stays away: an outage is a stall, nothing is rebuilt. Only a source that
// no longer holds that clock (source.Compacted) makes every node take a snapshot (a
// rebase). The feed records when the source last answered (lane.sourceHeard), which
// every delta tells the nodes: a node stops answering from its data once its distributor
// has not heard from the source for longer than the node's freshness bound.
type sourceFeed struct {
	s      *lane
	ctx    context.Context
	cancel context.CancelFunc
	out    <-chan source.Batch
	// retry fires when a failed watch is to start again, as a rebase if rebase is set.
	retry   <-chan time.Time
	rebase  bool
	backoff time.Duration
	errs    int       // failures in a row
	lost    time.Time // when the source stopped answering; zero while it answers
	asked   time.Time // when progress was last asked for, for liveness
}

// start watches the source from clock from.
func (f *sourceFeed) start(ctx context.Context, from uint64) {
	f.ctx, f.cancel = context.WithCancel(ctx)
	f.out = f.s.cfg.Source.Watch(f.ctx, from)
	if f.s.sourceHeard.Load() == 0 {
		f.s.sourceHeard.Store(time.Now().UnixNano()) // the first watch: nothing was missed yet
	}
}

// stop ends the watch; batches it had not delivered are read again from the clock seen.
func (f *sourceFeed) stop() {
	if f.cancel != nil {
		f.cancel()
		f.cancel, f.out = nil, nil
	}
}

// take takes what the watch delivered (ok false: it ended) and reports whether it is a batch
// for the sequencer, to which it adds it.
func (f *sourceFeed) take(b source.Batch, ok bool, seq *Sequencer) bool {
	switch {
	case !ok:
		f.out = nil
		return false
	case b.Err != nil:
		f.failed(b.Err)
		return false
	}
	f.received(time.Now())
	seq.AddBatch(b)
	return true
}

// received records a batch of the watch (changes or a mark): the source answers.
func (f *sourceFeed) received(now time.Time) {
	f.s.sourceHeard.Store(now.UnixNano())
	if !f.lost.IsZero() {
		f.s.log.Info("the source answers again", "after", now.Sub(f.lost).Round(time.Millisecond), "failed_attempts", f.errs)
		f.s.metrics.source.Available.Set(1)
	}
	f.lost, f.errs, f.backoff = time.Time{}, 0, 0
}

// failed takes a watch that ended with err: it is started again after the backoff, at a new
// clock with a rebase if the source no longer holds the one seen.
func (f *sourceFeed) failed(err error) {
	f.stop()
	class := f.s.metrics.source.Failed(err)
	switch {
	case errors.Is(err, source.ErrEnded):
		f.s.log.Info("the source ended the watch; watching it again", "err", err)
	case class == source.Misconfigured:
		f.s.log.Error("the source cannot be watched as configured; trying again until it is mended", "err", err, "retry_in", f.backoff)
	case f.errs == 0:
		f.s.log.Warn("the source watch failed; watching it again", "err", err, "class", class.String())
	default:
		f.s.log.Debug("the source watch failed again", "err", err, "attempt", f.errs+1, "retry_in", f.backoff)
	}
	if f.lost.IsZero() {
		f.lost = time.Now()
		f.s.metrics.source.Available.Set(0)
	}
	f.errs++
	f.rebase = f.rebase || class == source.Compacted
	f.retry = time.After(f.backoff)
	limit := maxWatchBackoff
	if class == source.Misconfigured {
		limit = maxMisconfiguredBackoff // an operator's fix takes longer than a restart
	}
	f.backoff = min(max(2*f.backoff, minWatchBackoff), limit)
}

// restart starts the watch again from the clock seq has seen or, after a compaction, from
// the source's clock now, onto which every node is rebased: the source lost changes the
// router never saw.
func (f *sourceFeed) restart(ctx context.Context, seq *Sequencer) {
	f.retry = nil
	from := seq.Seen()
	if f.rebase {
		rctx, cancel := context.WithTimeout(ctx, clockReadTimeout)
		clock, err := f.s.cfg.Source.Clock(rctx)
		cancel()
		if err != nil {
			f.failed(err) // tried again after the backoff, still as a rebase
			return
		}
		f.s.log.Warn("the source lost changes the router had not seen; every node takes a snapshot", "from", from, "clock", clock)
		seq.Rebase(clock)
		f.s.app.rebase(clock)
		from, f.rebase = clock, false
	}
	f.start(ctx, from)
}

// live asks the source for progress when the watch has said nothing for livenessAsk, so that
// a reachable source says so (see livenessAsk), and takes a watch silent for silenceLimit
// for a source out of reach.
func (f *sourceFeed) live(now time.Time) {
	heard := time.Unix(0, f.s.sourceHeard.Load())
	if f.out == nil || now.Sub(heard) < livenessAsk {
		return
	}
	if now.Sub(heard) >= silenceLimit && f.lost.IsZero() {
		f.s.log.Warn("the source has said nothing, though asked; its watch waits for it", "silence", now.Sub(heard).Round(time.Millisecond))
		f.lost = heard
		f.s.metrics.source.Available.Set(0)
	}
	if now.Sub(f.asked) >= livenessAsk {
		f.ask(now)
	}
}

// ask asks the running watch for progress (see source.Source.Progress).
func (f *sourceFeed) ask(now time.Time) {
	if f.out == nil {
		return
	}
	f.asked = now
	if err := f.s.cfg.Source.Progress(f.ctx); err != nil && f.ctx.Err() == nil {
		f.s.log.Debug("asking the source for progress", "err", err)
	}
}
