package sourcetest

import (
	"context"
	"errors"
	"sync"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// ErrCut is what an Outage answers while it is cut: Unavailable, as a database that went
// away is.
var ErrCut = source.MarkUnavailable(errors.New("sourcetest: the source is cut off"))

// Outage is a source a test can cut off, as a database that restarts or a link that fails:
// while it is cut, Clock, Scan and Progress fail with ErrCut, every watch open ends with it,
// and a new watch ends with it at once. Restore brings it back; what was written meanwhile
// is there, as in a database that was only out of reach.
type Outage struct {
	source.Source
	mu      sync.Mutex
	cut     bool
	cutting chan struct{} // closed by the next Cut
}

// NewOutage wraps src.
func NewOutage(src source.Source) *Outage { return &Outage{Source: src, cutting: make(chan struct{})} }

// Cut cuts the source off until Restore.
func (o *Outage) Cut() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.cut {
		o.cut = true
		close(o.cutting)
	}
}

// Restore makes the source reachable again.
func (o *Outage) Restore() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cut {
		o.cut = false
		o.cutting = make(chan struct{})
	}
}

// state says whether the source is cut now, and returns what the next Cut closes.
func (o *Outage) state() (cut bool, cutting <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.cut, o.cutting
}

// Clock implements source.Source.
func (o *Outage) Clock(ctx context.Context) (uint64, error) {
	if cut, _ := o.state(); cut {
		return 0, ErrCut
	}
	return o.Source.Clock(ctx)
}

// Progress implements source.Source.
func (o *Outage) Progress(ctx context.Context) error {
	if cut, _ := o.state(); cut {
		return ErrCut
	}
	return o.Source.Progress(ctx)
}

// Scan implements source.Source.
func (o *Outage) Scan(ctx context.Context, r keyspace.Range, at uint64, fn func(source.Item) error) (uint64, error) {
	if cut, _ := o.state(); cut {
		return 0, ErrCut
	}
	return o.Source.Scan(ctx, r, at, fn)
}

// Watch implements source.Source: the wrapped source's watch, ended with ErrCut once the
// source is cut.
func (o *Outage) Watch(ctx context.Context, from uint64) <-chan source.Batch {
	out := make(chan source.Batch)
	go func() {
		defer close(out)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cut, cutting := o.state()
		if cut {
			o.send(ctx, out, source.Batch{Err: ErrCut})
			return
		}
		in := o.Source.Watch(ctx, from)
		defer func() {
			cancel()
			for range in { // the wrapped watch ends with ctx
			}
		}()
		for {
			select {
			case <-cutting:
				o.send(ctx, out, source.Batch{Err: ErrCut})
				return
			case b, ok := <-in:
				if !ok || !o.send(ctx, out, b) || b.Err != nil {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func (o *Outage) send(ctx context.Context, out chan<- source.Batch, b source.Batch) bool {
	select {
	case out <- b:
		return true
	case <-ctx.Done():
		return false
	}
}
