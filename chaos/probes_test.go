package chaos_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/loadgen"
)

// written is one committed write of the writer: its source revision and when it returned.
type written struct {
	rev uint64
	at  time.Time
}

// staleNote is the staleness the probes log, once per window, with the node's state.
const staleNote = 5 * time.Second

// window is what the probes saw between two calls of probes.window.
type window struct {
	staleness time.Duration // the largest node staleness sampled
	stalest   string        // the node it was sampled on
	reads     int64
	readFails int64 // reads no replica answered
	// readMisses counts the reads answered "not found": the probes read only keys of the
	// fill, which always exist.
	readMisses int64
	writes     int64
	writeFails int64
	// regressions counts the samples where a node's clock was below its last one, in one
	// process (a restarted node starts from what it persisted).
	regressions int64
}

// probes are the writer, the reader and the staleness sampler that run throughout. Their
// goroutines belong to run, which ends when its context does.
type probes struct {
	w       itemWriter
	router  *client.Router
	pool    *kvclient.Pool
	nodes   []*member
	logf    func(format string, args ...any)
	initial int // keys 0..initial-1 are written before the faults and never deleted

	// gate pauses the writer: it holds a read lock per batch, the convergence check the lock.
	gate sync.RWMutex

	mu      sync.Mutex
	log     []written
	next    int // the next new key
	stale   time.Duration
	stalest string
	// skip is a node left out of the staleness: one a fault killed, whose clock after the
	// restart measures its own downtime (a wiped one's, all of history).
	skip      string
	writes    int64
	writeFail int64

	// last is each node's last sampled clock, by process, to see a clock go back.
	last    map[string]sampled
	regress int64

	reads, readFails, readMisses atomic.Int64
}

type sampled struct {
	pid   int
	clock uint64
}

func (p *probes) run(ctx context.Context, wg *sync.WaitGroup) {
	wg.Go(func() { p.every(ctx, 50*time.Millisecond, p.write) })
	wg.Go(func() { p.every(ctx, 20*time.Millisecond, p.read) })
	wg.Go(func() { p.every(ctx, 100*time.Millisecond, p.sample) })
}

func (p *probes) every(ctx context.Context, d time.Duration, fn func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}

// write writes a batch: five new keys and a rewrite of an old one; every fourth batch also
// deletes one of the keys written after the fill.
func (p *probes) write(ctx context.Context) {
	p.gate.RLock()
	defer p.gate.RUnlock()
	p.mu.Lock()
	first := p.next
	p.mu.Unlock()
	var items []client.Item
	for i := first; i < first+5; i++ {
		items = append(items, client.Item{Key: loadgen.Key(i), Value: []byte(time.Now().String()), HasValue: true})
	}
	old := rand.IntN(p.initial)
	items = append(items, client.Item{Key: loadgen.Key(old), Value: []byte(time.Now().String()), HasValue: true})
	// A short timeout: a batch stuck on a dead etcd member must not stop the writes for long.
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rev, err := p.w.PutMany(ctx, items)
	if err == nil && first%20 == 0 && first > p.initial {
		rev, err = p.w.Delete(ctx, loadgen.Key(p.initial+rand.IntN(first-p.initial)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next = first + 5 // a failed batch may be written: its keys are not used again
	p.writes++
	if err != nil {
		p.writeFail++
		return
	}
	p.log = append(p.log, written{rev: rev, at: time.Now()})
}

// read reads a key of the fill through the router, as a client of the store would: a
// replica that does not answer sends the read to the next.
func (p *probes) read(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := p.pool.Fetch(rctx, p.router, loadgen.Key(rand.IntN(p.initial)))
	if ctx.Err() != nil { // the run ended, not the read
		return
	}
	p.reads.Add(1)
	switch {
	case errors.Is(err, kvclient.ErrNotFound):
		p.readMisses.Add(1)
	case err != nil:
		p.readFails.Add(1)
	}
}

// sample reads each live node's clock and notes its staleness: the age of the oldest write
// of the writer the node has not applied.
func (p *probes) sample(ctx context.Context) {
	var wg sync.WaitGroup
	p.mu.Lock()
	skip := p.skip
	p.mu.Unlock()
	for _, n := range p.nodes {
		if !n.alive() || n.id == skip {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			st, err := p.pool.Node(n.addr).State(ctx)
			if err != nil {
				return
			}
			now := time.Now()
			p.mu.Lock()
			defer p.mu.Unlock()
			pid := n.current().Pid()
			if prev, ok := p.last[n.id]; ok && prev.pid == pid && st.Clock < prev.clock {
				p.regress++
			}
			if p.last == nil {
				p.last = map[string]sampled{}
			}
			p.last[n.id] = sampled{pid: pid, clock: st.Clock}
			age, oldest := staleness(p.log, st.Clock, now)
			if age > staleNote && p.stale <= staleNote {
				p.logf("node %s is %s stale: clock %d, cursor %s, distributor %q, oldest write not applied at %d",
					n.id, age.Round(time.Millisecond), st.Clock, st.Cursor, st.Distributor, oldest)
			}
			if age > p.stale {
				p.stale, p.stalest = age, n.id
			}
		})
	}
	wg.Wait()
}

// staleness returns the age at now of the oldest write in log (ordered by revision) that a
// node at clock has not applied, and that write's revision; 0 if it applied them all.
func staleness(log []written, clock uint64, now time.Time) (time.Duration, uint64) {
	i := sort.Search(len(log), func(i int) bool { return log[i].rev > clock })
	if i == len(log) {
		return 0, 0
	}
	return max(now.Sub(log[i].at), 0), log[i].rev
}

// window returns what the probes saw since the last call, and starts a new window.
func (p *probes) window() window {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := window{staleness: p.stale, stalest: p.stalest, reads: p.reads.Swap(0), readFails: p.readFails.Swap(0),
		readMisses: p.readMisses.Swap(0), writes: p.writes, writeFails: p.writeFail, regressions: p.regress}
	p.stale, p.stalest, p.writes, p.writeFail, p.skip, p.regress = 0, "", 0, 0, "", 0
	return w
}

// writtenAfter returns the first write of the writer that returned after t, if any yet.
func (p *probes) writtenAfter(t time.Time) (written, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := sort.Search(len(p.log), func(i int) bool { return p.log[i].at.After(t) })
	if i == len(p.log) {
		return written{}, false
	}
	return p.log[i], true
}

// skipNode leaves node id out of the staleness until the next window.
func (p *probes) skipNode(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.skip = id
}

// pause stops the writer (after its batch in flight) until the returned function is called.
func (p *probes) pause() (resume func()) {
	p.gate.Lock()
	return p.gate.Unlock
}
