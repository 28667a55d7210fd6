// Package loadgen drives the example key-value store: it fills the data source with items,
// keeps changing some, and reads keys through client.Router at a steady rate with a skewed
// popularity that can shift over time (the offline simulator's workloads, one epoch per
// Epoch of wall time), so that the assigner has real load to balance.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/internal/sim"
)

// Writer writes items to the data source: client/writer (etcd) or client/pgwriter
// (PostgreSQL).
type Writer interface {
	PutMany(ctx context.Context, items []writer.Item) (uint64, error)
	Put(ctx context.Context, key, value []byte) (uint64, error)
	Delete(ctx context.Context, key []byte) (uint64, error)
}

// Config configures a Generator.
type Config struct {
	// Writer writes items to the data source.
	Writer Writer
	// Router finds the nodes holding a key (a *client.Router); Run reads through it. Fill
	// needs none.
	Router kvclient.Router
	// Keys is the number of distinct keys, Key(0) to Key(Keys-1).
	Keys int
	// Workload is a workload of the simulator (slicectl sim --help): uniform, zipf:S,
	// hotspot-shift[:S[:PERIOD]], flash-crowd[:KEYS[:SHARE]], diurnal[:PERIOD].
	Workload string
	// Epoch is the wall time of one workload epoch; default 1 s.
	Epoch time.Duration
	// Epochs is how many epochs a run is expected to last, for workloads that place events in
	// it (flash-crowd); default 60.
	Epochs int
	// ReadRate is reads per second; WriteRate, writes per second (0: none).
	ReadRate, WriteRate float64
	// DeleteShare is the share of writes that delete their key rather than write it again
	// (0: none); a later write of the key brings it back.
	DeleteShare float64
	// Filled says that every key was written before the generator started (by an earlier
	// Fill, or kvload fill): Run counts a key read as "not found" as a miss from the start.
	// Without it, only the keys this generator wrote count so.
	Filled bool
	// Workers is the number of reads in flight at most; default 8.
	Workers int
	// Seed picks the popular keys and the random choices.
	Seed uint64
	// HTTP is the client for the nodes; default a plaintext client with a 5 s timeout. Nodes
	// that serve mutual TLS need one with a certificate (kvclient.HTTPClient).
	HTTP   *http.Client
	Logger *slog.Logger
}

// Stats counts what a Generator did.
//
// Every read that ended before the run did is one of: a hit (a replica answered with the
// item); a miss (a replica answered "not found" for a key that existed throughout the read:
// a write of it had committed before the read began, and no delete of it began before the
// read ended); absent (answered "not found" for any other key: never written, deleted, or
// being deleted or written again); or failed (no replica answered, each one the client tried
// failing, refusing or misdirecting the read). Reads is their sum once the run is over. A
// read the end of the run cut short is not counted.
//
// Misdirected, Stale and Errors count the replicas that did not answer on the way, also for
// reads that another replica answered then: 421 answers (the key is not the node's), 503
// answers beyond the node's freshness bound, and the other failures (no connection, a
// timeout, an unexpected answer). Served counts the reads each node answered with the item
// (hits), which is the load the nodes really carried.
type Stats struct {
	Reads, Hits, Misses, Absent, Failed uint64
	Misdirected, Stale, Errors          uint64
	Writes, Deletes, WriteErrors        uint64
	Served                              map[string]uint64
}

// Generator generates load. Its methods are safe for concurrent use.
type Generator struct {
	cfg      Config
	log      *slog.Logger
	workload sim.Workload

	mu      sync.Mutex
	served  map[string]uint64
	nodes   *kvclient.Pool
	epoch   int
	cum     []float64 // cumulative popularity of the keys in epoch
	rng     *rand.Rand
	version uint64

	// keys holds, per key, whether it exists (bit 0: a write of it committed and no delete of
	// it began since) and the number of deletes of it begun (the other bits), so that a read
	// can tell whether a delete began while it ran.
	keys []atomic.Uint64

	reads, hits, misses, absent, failed atomic.Uint64
	misdirected, stale, errs            atomic.Uint64
	writes, deletes, writeErrs          atomic.Uint64
}

// Key returns the i-th key.
func Key(i int) []byte { return []byte("key-" + strconv.Itoa(i)) }

// New checks cfg and returns a Generator.
func New(cfg Config) (*Generator, error) {
	switch {
	case cfg.Writer == nil:
		return nil, errors.New("loadgen: a writer is required")
	case cfg.Keys < 1:
		return nil, fmt.Errorf("loadgen: %d keys: want at least 1", cfg.Keys)
	case cfg.ReadRate < 0 || cfg.WriteRate < 0:
		return nil, fmt.Errorf("loadgen: negative rate (reads %v/s, writes %v/s)", cfg.ReadRate, cfg.WriteRate)
	case cfg.Epoch < 0:
		return nil, fmt.Errorf("loadgen: negative epoch %s", cfg.Epoch)
	case cfg.DeleteShare < 0 || cfg.DeleteShare > 1:
		return nil, fmt.Errorf("loadgen: delete share %v: want 0 to 1", cfg.DeleteShare)
	}
	if cfg.Epoch == 0 {
		cfg.Epoch = time.Second
	}
	if cfg.Epochs == 0 {
		cfg.Epochs = 60
	}
	if cfg.Workers == 0 {
		cfg.Workers = 8
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 5 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Workload == "" {
		cfg.Workload = "uniform"
	}
	w, err := sim.ParseWorkload(cfg.Workload, cfg.Keys, cfg.Epochs, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	g := &Generator{cfg: cfg, log: cfg.Logger, workload: w, served: map[string]uint64{}, nodes: kvclient.NewPool(cfg.HTTP),
		epoch: -1, rng: rand.New(rand.NewPCG(cfg.Seed, 0x10ad)), keys: make([]atomic.Uint64, cfg.Keys)}
	if cfg.Filled {
		for i := range g.keys {
			g.keys[i].Store(exists)
		}
	}
	return g, nil
}

// value is the value of a key's version-th write.
func value(key []byte, version uint64) []byte {
	return fmt.Appendf(nil, "%s=v%d", key, version)
}

// fillBatch is the number of items Fill writes per transaction.
const fillBatch = 100

// Fill writes every key once, in batches; it returns the clock of the last write.
func (g *Generator) Fill(ctx context.Context) (uint64, error) {
	var clock uint64
	batch := make([]writer.Item, 0, fillBatch)
	for i := 0; i < g.cfg.Keys; i++ {
		k := Key(i)
		batch = append(batch, writer.Item{Key: k, Value: value(k, 0), HasValue: true})
		if len(batch) == fillBatch || i == g.cfg.Keys-1 {
			c, err := g.cfg.Writer.PutMany(ctx, batch)
			if err != nil {
				return clock, fmt.Errorf("loadgen: filling keys %d..%d: %w", i+1-len(batch), i, err)
			}
			clock = c
			g.writes.Add(uint64(len(batch)))
			for j := i + 1 - len(batch); j <= i; j++ {
				g.written(j)
			}
			batch = batch[:0]
		}
	}
	return clock, nil
}

// Run reads and writes at the configured rates until ctx ends; it returns nil then. Failed
// reads and writes are counted and logged, not fatal: nodes and assigners come and go.
func (g *Generator) Run(ctx context.Context) error {
	if g.cfg.ReadRate > 0 && g.cfg.Router == nil {
		return errors.New("loadgen: reading needs a router")
	}
	start := time.Now()
	var wg sync.WaitGroup
	if g.cfg.ReadRate > 0 {
		lim := rate.NewLimiter(rate.Limit(g.cfg.ReadRate), g.cfg.Workers)
		for range g.cfg.Workers {
			wg.Go(func() {
				for lim.Wait(ctx) == nil {
					g.read(ctx, g.pick(int(time.Since(start)/g.cfg.Epoch)))
				}
			})
		}
	}
	if g.cfg.WriteRate > 0 {
		lim := rate.NewLimiter(rate.Limit(g.cfg.WriteRate), 1)
		wg.Go(func() {
			for lim.Wait(ctx) == nil {
				g.write(ctx)
			}
		})
	}
	wg.Wait()
	return nil
}

// pick draws a key by its popularity in epoch e, and returns its index.
func (g *Generator) pick(e int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e != g.epoch {
		loads := make([]float64, g.cfg.Keys)
		g.workload.Fill(e, loads)
		g.cum = loads
		for i := 1; i < len(loads); i++ {
			g.cum[i] += g.cum[i-1]
		}
		g.epoch = e
	}
	x := g.rng.Float64() * g.cum[len(g.cum)-1]
	return sort.SearchFloat64s(g.cum, x)
}

// exists is bit 0 of a key's state: the key exists.
const exists = 1

// written records that a write of key i committed.
func (g *Generator) written(i int) { g.keys[i].Or(exists) }

// deleting records that a delete of key i begins: the key no longer surely exists.
func (g *Generator) deleting(i int) {
	for {
		s := g.keys[i].Load()
		if g.keys[i].CompareAndSwap(s, s&^exists+2) {
			return
		}
	}
}

// read reads key i through the router and counts the outcome.
func (g *Generator) read(ctx context.Context, i int) {
	before := g.keys[i].Load()
	res, err := g.nodes.Fetch(ctx, g.cfg.Router, Key(i))
	if err != nil && !errors.Is(err, kvclient.ErrNotFound) && ctx.Err() != nil {
		return // the run ended, not the read
	}
	g.misdirected.Add(uint64(res.Misdirected))
	g.stale.Add(uint64(res.Stale))
	g.errs.Add(uint64(res.Errors))
	switch {
	case err == nil:
		g.hits.Add(1)
		g.mu.Lock()
		g.served[res.Served.ID]++
		g.mu.Unlock()
	case errors.Is(err, kvclient.ErrNotFound):
		if before&exists != 0 && g.keys[i].Load() == before {
			g.misses.Add(1)
			g.log.Debug("miss", "key", string(Key(i)), "node", res.Served.ID)
		} else {
			g.absent.Add(1)
		}
	default:
		g.failed.Add(1)
		g.log.Debug("read failed", "key", string(Key(i)), "tries", res.Tries, "err", err)
	}
	g.reads.Add(1)
}

// write writes a new version of a uniformly drawn key, or deletes it (DeleteShare).
func (g *Generator) write(ctx context.Context) {
	g.mu.Lock()
	i := g.rng.IntN(g.cfg.Keys)
	del := g.rng.Float64() < g.cfg.DeleteShare
	g.mu.Unlock()
	g.change(ctx, i, del)
}

// change writes a new version of key i, or deletes it, and records what became of it.
func (g *Generator) change(ctx context.Context, i int, del bool) {
	k := Key(i)
	var err error
	if del {
		g.deleting(i)
		_, err = g.cfg.Writer.Delete(ctx, k)
	} else {
		g.mu.Lock()
		g.version++
		v := g.version
		g.mu.Unlock()
		_, err = g.cfg.Writer.Put(ctx, k, value(k, v))
	}
	switch {
	case err != nil:
		// The write may have committed or not: a put leaves the key as it was, which is
		// right if it existed and errs towards "absent" if not; a delete left it absent.
		if ctx.Err() == nil {
			g.writeErrs.Add(1)
			g.log.Warn("write failed", "key", string(k), "delete", del, "err", err)
		}
	case del:
		g.deletes.Add(1)
	default:
		g.written(i)
		g.writes.Add(1)
	}
}

// Stats returns the counts so far.
func (g *Generator) Stats() Stats {
	g.mu.Lock()
	served := make(map[string]uint64, len(g.served))
	for id, n := range g.served {
		served[id] = n
	}
	g.mu.Unlock()
	return Stats{Reads: g.reads.Load(), Hits: g.hits.Load(), Misses: g.misses.Load(), Absent: g.absent.Load(),
		Failed: g.failed.Load(), Misdirected: g.misdirected.Load(), Stale: g.stale.Load(), Errors: g.errs.Load(),
		Writes: g.writes.Load(), Deletes: g.deletes.Load(), WriteErrors: g.writeErrs.Load(), Served: served}
}
