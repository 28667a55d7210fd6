// Package webview is the assigner's read-only web view: the key space as a heatmap over time
// (package heatmap), the nodes and members, the last passes and the feed of quanta, kept live
// by server-sent events. The page and its scripts are embedded (static/); the assigner serves
// them on its metrics listener under /ui/, behind its mutual TLS and the viewer role.
//
// A View is fed by the assigner's leader loop (Record, Pass, Publish) and read by the HTTP
// handlers; a lock guards it. What it cannot hold (the nodes, the status) the handlers ask of
// the assigner's API, as any client would.
package webview

import (
	"context"
	"sync"
	"time"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/heatmap"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// Backend is the part of the assigner's API the page shows as it is.
type Backend interface {
	Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error)
	ListNodes(context.Context, *pb.ListNodesRequest) (*pb.ListNodesResponse, error)
}

// How much of the recent past the View keeps besides the heatmap.
const (
	keptPasses = 20
	keptQuanta = 100
)

// Pass is a pass's explanation as the page shows it.
type Pass struct {
	At      time.Time
	Explain *pb.ExplainResponse
}

// Quantum is a quantum of the feed.
type Quantum struct {
	Term, Seq, Generation uint64
	At                    time.Time
	Cause, By             string
	Ops                   []string
}

// maxOps bounds the ops a quantum of the feed lists: a pass may make thousands.
const maxOps = 20

// View holds what the page shows of the past. The zero value is not usable: call New.
type View struct {
	backend   Backend
	cfg       heatmap.Config
	zoneLabel string

	mu      sync.RWMutex
	hist    *heatmap.History
	last    *assignment.Assignment // the map of the last quantum published
	passes  []Pass                 // newest last
	quanta  []Quantum              // newest last
	changed chan struct{}          // closed, and replaced, on every change
	version uint64                 // counts the changes
}

// New returns an empty View whose heatmap is bounded by cfg, reading the rest from backend;
// a node's zone is its label zoneLabel ("" for none).
func New(cfg heatmap.Config, backend Backend, zoneLabel string) (*View, error) {
	h, err := heatmap.New(cfg)
	if err != nil {
		return nil, err
	}
	return &View{backend: backend, cfg: h.Config(), zoneLabel: zoneLabel, hist: h, changed: make(chan struct{})}, nil
}

// Reset empties the heatmap's history and the feed, for a new leader, which restores the
// history from the persisted chunks (Restore).
func (v *View) Reset() {
	h, _ := heatmap.New(v.cfg) // v.cfg was checked by New
	v.mu.Lock()
	defer v.mu.Unlock()
	v.hist, v.last, v.passes, v.quanta = h, nil, nil, nil
	v.notify()
}

// Restore adds a persisted chunk of history (heatmap.History.Restore).
func (v *View) Restore(data []byte) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.hist.Restore(data)
}

// Encode returns chunk k of the history as it stands (heatmap.History.Encode).
func (v *View) Encode(k uint64) ([]byte, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.hist.Encode(k)
}

// Bounds returns what the history holds.
func (v *View) Bounds() heatmap.Bounds {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.hist.Bounds()
}

// Record adds a column of the map a, whose slices carry loads, at time at.
func (v *View) Record(at time.Time, a *assignment.Assignment, loads []float64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.hist.Record(at, a, loads)
	v.notify()
}

// Pass keeps the explanation of a pass (or of a failed one).
func (v *View) Pass(at time.Time, x *pb.ExplainResponse) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.passes = keep(v.passes, Pass{At: at, Explain: x}, keptPasses)
	v.notify()
}

// Publish observes a quantum published with the map it makes: its changes go on the heatmap
// and in the feed.
func (v *View) Publish(q quantum.Quantum, after *assignment.Assignment) {
	v.mu.Lock()
	defer v.mu.Unlock()
	before := v.last
	v.last = after
	if q.ClockOnly() || q.Reinitializing() {
		return
	}
	v.hist.Observe(q, before)
	fq := Quantum{Term: q.Term, Seq: q.Seq, Generation: q.Generation, At: q.Time, Cause: q.Cause, By: q.By}
	for i, op := range q.Ops {
		if i == maxOps {
			fq.Ops = append(fq.Ops, "…")
			break
		}
		fq.Ops = append(fq.Ops, op.String())
	}
	v.quanta = keep(v.quanta, fq, keptQuanta)
	v.notify()
}

// Drain marks a node's drain (or its cancellation) on the heatmap.
func (v *View) Drain(at time.Time, node string, cancel bool, by string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	what := "drain " + node
	if cancel {
		what = "drain of " + node + " cancelled"
	}
	v.hist.Add(heatmap.Event{At: at, Kind: heatmap.KindDrain, Range: keyspace.Full(), Cause: "admin:drain", By: by, What: what})
	v.notify()
}

// keep appends x to a ring of at most n, dropping the oldest.
func keep[T any](s []T, x T, n int) []T {
	if len(s) == n {
		copy(s, s[1:])
		s = s[:n-1]
	}
	return append(s, x)
}

// notify wakes the event streams. v.mu is held.
func (v *View) notify() {
	close(v.changed)
	v.changed = make(chan struct{})
	v.version++
}

// watch returns the version and a channel closed at the next change.
func (v *View) watch() (uint64, <-chan struct{}) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.version, v.changed
}
