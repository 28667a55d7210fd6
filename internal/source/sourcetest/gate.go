// Package sourcetest holds test helpers around a source.Source.
package sourcetest

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// Gated is a source whose scans wait while its gate is shut, so that a test can keep a
// node loading a slice (its scan held) for as long as it looks. Changes flow as usual.
type Gated struct {
	source.Source
	mu      sync.Mutex
	gate    chan struct{} // nil: scans run
	waiting atomic.Int64  // scans held now
}

// Shut holds every scan that starts from now on until Open.
func (g *Gated) Shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate == nil {
		g.gate = make(chan struct{})
	}
}

// Open lets the held scans and every later one run.
func (g *Gated) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
}

// Waiting returns how many scans the gate holds now.
func (g *Gated) Waiting() int64 { return g.waiting.Load() }

// Scan scans the wrapped source once the gate is open, or fails with ctx's error.
func (g *Gated) Scan(ctx context.Context, r keyspace.Range, at uint64, fn func(source.Item) error) (uint64, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		g.waiting.Add(1)
		defer g.waiting.Add(-1)
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return g.Source.Scan(ctx, r, at, fn)
}
