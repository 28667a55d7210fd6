package distributor

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// pieceBytes is about how much a scan reads before it hands its items to the router: what a
// scan holds at once. Under a small scan-ahead bound, pieces are an eighth of it.
const pieceBytes = 1 << 20

// scanJob is a scan the router asked for, as far as it has been read.
type scanJob struct {
	req   ScanRequest
	rest  keyspace.Range // what remains to be read
	start time.Time
	// q is the node's queue, which a read asks for room (see queue.scanRoom), and ahead the
	// room it has; both are set when the read starts.
	q     *queue
	ahead int
	// at is the clock the reads so far are positioned at (source.Source.Scan): the latest
	// of them, when a scan paused for its node is read on later.
	at uint64
}

// scanPiece is what a reader hands to the loop: items of job's scan, in order. A final
// piece ends the read: the scan is done (rest is nil), paused at rest until its node takes
// what was read, or failed with err (the source no longer holds its clock).
type scanPiece struct {
	job   *scanJob
	items []op
	final bool
	rest  *keyspace.Range
	err   error
	// filled, for a piece that is not final, is closed once the node's queue holds its
	// items, so that the reader asks for room knowing of them.
	filled chan struct{}
}

// scanner runs the router's scans against the source in bounded pieces: at most workers
// read at once, a node's scans one after the other, each only while the node's queue has
// room for more (applier.scanReady). A scan that runs out of room stops at a hash and picks
// up from there later, at the same clock, so waiting for a slow node holds no reader. What a
// node's snapshot holds in memory is thus at most the scan-ahead bound and two pieces.
//
// The loop that owns the router calls add, dispatch and finish; readers run on goroutines
// that end with ctx and that wg counts.
type scanner struct {
	src     source.Source
	app     *applier
	log     *slog.Logger
	metrics *metrics
	workers int
	piece   int // bytes

	waiting map[assignment.NodeID][]*scanJob // in the order the router asked for them
	reading int
	pieces  chan scanPiece
}

func newScanner(src source.Source, app *applier, workers int, log *slog.Logger, m *metrics) *scanner {
	return &scanner{src: src, app: app, log: log, metrics: m, workers: workers,
		piece:   max(1, min(pieceBytes, app.scanAhead/8)),
		waiting: map[assignment.NodeID][]*scanJob{}, pieces: make(chan scanPiece)}
}

// add queues scans the router asked for.
func (sc *scanner) add(reqs []ScanRequest) {
	for _, req := range reqs {
		sc.waiting[req.Node] = append(sc.waiting[req.Node], &scanJob{req: req, rest: req.Range, start: time.Now()})
	}
}

// dispatch starts reading the scans that may read on, as far as readers are free, and drops
// the ones the router no longer awaits.
func (sc *scanner) dispatch(ctx context.Context, wg *sync.WaitGroup) {
	for id, jobs := range sc.waiting {
		for len(jobs) > 0 && sc.reading < sc.workers {
			ready, stale := sc.app.scanReady(jobs[0].req)
			if !ready && !stale {
				break
			}
			job := jobs[0]
			jobs[0] = nil
			jobs = jobs[1:]
			if ready {
				job.q, job.ahead = sc.app.queues[job.req.Node], sc.app.scanAhead
				sc.reading++
				wg.Add(1)
				go func() {
					defer wg.Done()
					sc.read(ctx, job)
				}()
				break // the node's next scan waits for this one
			}
		}
		if len(jobs) == 0 {
			delete(sc.waiting, id)
		} else {
			sc.waiting[id] = jobs
		}
	}
}

// finish hands a piece to the router.
func (sc *scanner) finish(p scanPiece) {
	id := p.job.req.ID
	switch {
	case !p.final:
		sc.app.scanItems(id, p.items)
		close(p.filled)
		return
	case p.err != nil:
		sc.log.Warn("scan failed; the node starts over with a snapshot", "node", p.job.req.Node, "err", p.err)
		sc.app.scanDone(id, nil, 0, p.err)
	case p.rest != nil:
		sc.app.scanItems(id, p.items)
		p.job.rest = *p.rest
		node := p.job.req.Node
		// Still the first of its node's scans: it goes back to the front.
		sc.waiting[node] = append([]*scanJob{p.job}, sc.waiting[node]...)
	default:
		sc.metrics.scans.WithLabelValues("ok").Inc()
		sc.metrics.scanLatency.Observe(time.Since(p.job.start).Seconds())
		sc.app.scanDone(id, p.items, p.job.at, nil)
	}
	sc.reading--
}

// errPause stops a read at a piece's end when the node has no room for more.
var errPause = errors.New("distributor: scan paused")

// read reads job's scan on from job.rest, handing pieces to the loop while the node's queue
// has room, and ends with a final piece. A read that fails for a passing reason is retried
// from where it stopped.
func (sc *scanner) read(ctx context.Context, job *scanJob) {
	backoff := 50 * time.Millisecond
	for {
		var items []op
		size := 0
		var last uint64
		var rest *keyspace.Range
		at, err := sc.src.Scan(ctx, job.rest, job.req.Clock, func(it source.Item) error {
			// A piece ends between hashes, so that the scan can pick up at a hash.
			if size >= sc.piece && it.Hash != last {
				if room, _ := job.q.scanRoom(job.req.ID, job.ahead); !room {
					rest = &keyspace.Range{Start: it.Hash, End: job.rest.End}
					return errPause
				}
				p := scanPiece{job: job, items: items, filled: make(chan struct{})}
				if !sc.send(ctx, p) {
					return ctx.Err()
				}
				select {
				case <-p.filled:
				case <-ctx.Done():
					return ctx.Err()
				}
				job.rest.Start = it.Hash // for a retry
				items, size = nil, 0
			}
			n := len(items)
			items = encodeItem(it, items)
			for _, o := range items[n:] {
				size += o.size()
			}
			last = it.Hash
			return nil
		})
		if err == nil || errors.Is(err, errPause) {
			// A read stopped early has seen the source at no later clock than a whole one
			// would: the one asked is as good as any.
			job.at = max(job.at, at, job.req.Clock)
		}
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errPause):
			sc.metrics.scanPauses.Inc()
			sc.send(ctx, scanPiece{job: job, items: items, final: true, rest: rest})
			return
		case err == nil:
			sc.send(ctx, scanPiece{job: job, items: items, final: true, rest: rest})
			return
		case errors.Is(err, source.ErrCompacted):
			sc.metrics.scans.WithLabelValues("compacted").Inc()
			sc.send(ctx, scanPiece{job: job, final: true, err: err})
			return
		}
		sc.metrics.scans.WithLabelValues("error").Inc()
		sc.log.Warn("scan failed; retrying", "node", job.req.Node, "range", job.rest, "clock", job.req.Clock, "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (sc *scanner) send(ctx context.Context, p scanPiece) bool {
	select {
	case sc.pieces <- p:
		return true
	case <-ctx.Done():
		return false
	}
}
