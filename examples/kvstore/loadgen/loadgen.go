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

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/internal/sim"
)

// Config configures a Generator.
type Config struct {
	// Writer writes items to the data source.
	Writer *writer.Writer
	// Router finds the nodes holding a key; Run reads through it. Fill needs none.
	Router *client.Router
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
	// Workers is the number of reads in flight at most; default 8.
	Workers int
	// Seed picks the popular keys and the random choices.
	Seed uint64
	// HTTP is the client for the nodes; default a plaintext client with a 5 s timeout. Nodes
	// that serve mutual TLS need one with a certificate (kvclient.HTTPClient).
	HTTP   *http.Client
	Logger *slog.Logger
}

// Stats counts what a Generator did. Served counts the reads each node answered with the
// item (hits), which is the load the nodes really carried.
type Stats struct {
	Reads, Hits, Misses, Misdirected, Errors, Writes uint64
	Served                                           map[string]uint64
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

	reads, hits, misses, misdirected, errs, writes atomic.Uint64
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
		epoch: -1, rng: rand.New(rand.NewPCG(cfg.Seed, 0x10ad))}
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

// pick draws a key by its popularity in epoch e.
func (g *Generator) pick(e int) []byte {
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
	return Key(sort.SearchFloat64s(g.cum, x))
}

// read reads key through the router and counts the outcome. A read that a node redirected
// counts as misdirected, and again if its second node declined it too.
func (g *Generator) read(ctx context.Context, key []byte) {
	g.reads.Add(1)
	_, _, rep, redirected, err := g.nodes.Read(ctx, g.cfg.Router, key)
	if redirected {
		g.misdirected.Add(1)
	}
	var nm *kvclient.NotMineError
	switch {
	case err == nil:
		g.hits.Add(1)
		g.mu.Lock()
		g.served[rep.ID]++
		g.mu.Unlock()
	case errors.Is(err, kvclient.ErrNotFound):
		g.misses.Add(1)
	case errors.As(err, &nm):
		g.misdirected.Add(1)
	case ctx.Err() != nil:
	default:
		g.errs.Add(1)
		g.log.Debug("read failed", "key", string(key), "node", rep.ID, "err", err)
	}
}

// write writes a new version of a uniformly drawn key.
func (g *Generator) write(ctx context.Context) {
	g.mu.Lock()
	k := Key(g.rng.IntN(g.cfg.Keys))
	g.version++
	v := g.version
	g.mu.Unlock()
	if _, err := g.cfg.Writer.Put(ctx, k, value(k, v)); err != nil {
		if ctx.Err() == nil {
			g.errs.Add(1)
			g.log.Warn("write failed", "key", string(k), "err", err)
		}
		return
	}
	g.writes.Add(1)
}

// Stats returns the counts so far.
func (g *Generator) Stats() Stats {
	g.mu.Lock()
	served := make(map[string]uint64, len(g.served))
	for id, n := range g.served {
		served[id] = n
	}
	g.mu.Unlock()
	return Stats{Reads: g.reads.Load(), Hits: g.hits.Load(), Misses: g.misses.Load(), Misdirected: g.misdirected.Load(),
		Errors: g.errs.Load(), Writes: g.writes.Load(), Served: served}
}
