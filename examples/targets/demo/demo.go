// Package demo runs the two-target demo (DEMO_APP=both make demo): one control plane, an
// embedded etcd and two assigners, serving two sharded services as two targets. The example
// key-value store is the default target, with its distributors and nodes; the example
// counter is target "counter", whose roles, exclusive primaries and lease come from the
// assigners' targets file, with its members on a throwaway PostgreSQL. Each example's own
// demo runs against the plane, side by side, with its load, its live view and its check.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	counterdemo "github.com/sliceplane/sliceplane/examples/counter/demo"
	kvdemo "github.com/sliceplane/sliceplane/examples/kvstore/demo"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/target/registry"
)

// CounterTarget is the counter's target; the key-value store's is the default one.
const CounterTarget = "counter"

// Config shapes the demo.
type Config struct {
	// Bin holds the binaries of both examples' demos; Dir, the demo's data and logs.
	Bin, Dir string
	// Duration is each demo's load; 0 runs until Stop is closed.
	Duration time.Duration
	Stop     <-chan struct{}
	// KV and Counter shape each example's demo; Run sets their Bin, Dir, Duration, Stop,
	// Plane, Out and Log, and the counter's Target.
	KV      kvdemo.Config
	Counter counterdemo.Config
	// Out receives the lines of both demos, each beginning with its example's name, and
	// the demo's own; Log, diagnostics.
	Out io.Writer
	Log *slog.Logger
}

// Summary is each demo's outcome.
type Summary struct {
	KV      kvdemo.Summary
	Counter counterdemo.Summary
}

// Err returns what each demo's check found amiss.
func (s Summary) Err() error { return errors.Join(s.KV.Err(), s.Counter.Err()) }

// The prefixes of each demo's lines.
const (
	kvPrefix      = "[kvstore] "
	counterPrefix = "[counter] "
)

// Run starts the control plane and both demos against it, runs their loads side by side
// until Duration passes or Stop is closed, then their checks; it stops every process on
// the way out. The summary is valid when err is nil.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	started := time.Now()
	out := &lines{w: cfg.Out}
	plane, err := startPlane(ctx, cfg)
	if err != nil {
		return Summary{}, err
	}
	defer func() {
		if err := plane.Stop(10 * time.Second); err != nil {
			out.say("demo: %v", err)
		}
	}()
	// One after the other, so that their intros do not mix.
	kv, err := kvdemo.Start(ctx, kvConfig(cfg, plane, out))
	if err != nil {
		return Summary{}, fmt.Errorf("demo: the key-value store: %w", err)
	}
	defer kv.Stop()
	counter, err := counterdemo.Start(ctx, counterConfig(cfg, plane, out))
	if err != nil {
		return Summary{}, fmt.Errorf("demo: the counter: %w", err)
	}
	defer counter.Stop()
	if err := intro(cfg, plane, out, started); err != nil {
		return Summary{}, err
	}
	return runBoth(ctx, kv, counter)
}

// startPlane starts etcd and two assigners: every assigner is active, each leading the
// targets it ranks first. The counter's target is declared in their targets file.
func startPlane(ctx context.Context, cfg Config) (*kvcluster.Plane, error) {
	pki, err := launch.NewPKI(filepath.Join(cfg.Dir, "pki"), 0)
	if err != nil {
		return nil, err
	}
	return kvcluster.StartPlane(ctx, kvcluster.PlaneOptions{Bin: cfg.Bin, Dir: cfg.Dir, PKI: pki, Assigners: 2,
		AssignerArgs: append(slices.Clone(kvcluster.QuickAssignerArgs), counterdemo.PlaneArgs()...),
		Targets:      map[string]registry.Config{CounterTarget: counterdemo.TargetConfig(cfg.Counter)}, Log: cfg.Log})
}

// kvConfig is the key-value store's demo, on plane's default target.
func kvConfig(cfg Config, plane *kvcluster.Plane, out *lines) kvdemo.Config {
	c := cfg.KV
	c.Bin, c.Dir, c.Duration, c.Stop, c.Plane, c.Log = cfg.Bin, cfg.Dir, cfg.Duration, cfg.Stop, plane, cfg.Log
	c.Out = out.prefixed(kvPrefix)
	return c
}

// counterConfig is the counter's demo, on plane's target CounterTarget.
func counterConfig(cfg Config, plane *kvcluster.Plane, out *lines) counterdemo.Config {
	c := cfg.Counter
	c.Bin, c.Dir, c.Duration, c.Stop, c.Plane, c.Log = cfg.Bin, cfg.Dir, cfg.Duration, cfg.Stop, plane, cfg.Log
	c.Target, c.Out = CounterTarget, out.prefixed(counterPrefix)
	return c
}

// intro says what the plane serves, and how to look at both targets at once.
func intro(cfg Config, plane *kvcluster.Plane, out *lines, started time.Time) error {
	admin, err := plane.PKI.Issue("admin", "demo")
	if err != nil {
		return err
	}
	assigners := plane.Assigners()
	out.say("two targets, one control plane: etcd and %d assigners on loopback, mTLS on (throwaway CA in %s; up in %s)",
		len(assigners), plane.PKI.Dir, time.Since(started).Round(100*time.Millisecond))
	out.say("  targets:   %s: the key-value store (lines %s); %s: the counter (lines %s), its config in %s",
		target.Default, strings.TrimSpace(kvPrefix), CounterTarget, strings.TrimSpace(counterPrefix), plane.TargetsFile)
	slicectl := filepath.Join(cfg.Bin, "slicectl") + " --assigner " + strings.Join(kvcluster.Addrs(assigners), ",") + " " +
		strings.Join(launch.TLSArgs(admin), " ")
	out.say("  inspect:   %s targets   (an admin of every target: also --target %s status)", slicectl, CounterTarget)
	// Flush left, unlike its neighbours: the line is looked for by its first word.
	web, err := plane.PKI.WebLine(assigners[0].Metrics, "demo")
	if err != nil {
		return err
	}
	out.say("%s", web)
	return nil
}

// runBoth runs both demos' loads side by side, each to its check.
func runBoth(ctx context.Context, kv *kvdemo.Started, counter *counterdemo.Started) (Summary, error) {
	var s Summary
	var kvErr, counterErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		if s.KV, kvErr = kv.Run(ctx); kvErr != nil {
			kvErr = fmt.Errorf("demo: the key-value store: %w", kvErr)
		}
	})
	wg.Go(func() {
		if s.Counter, counterErr = counter.Run(ctx); counterErr != nil {
			counterErr = fmt.Errorf("demo: the counter: %w", counterErr)
		}
	})
	wg.Wait()
	return s, errors.Join(kvErr, counterErr)
}

// lines writes the lines of both demos and the demo's own to one writer, a whole line at a
// time, so that the demos' lines do not mix within a line.
type lines struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lines) say(format string, args ...any) { l.write("", fmt.Sprintf(format+"\n", args...)) } //nolint:errcheck // a terminal

// prefixed returns a writer to l that begins each line with prefix.
func (l *lines) prefixed(prefix string) io.Writer { return prefixWriter{l: l, prefix: prefix} }

// write writes each line of text, beginning with prefix.
func (l *lines) write(prefix, text string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for line := range strings.SplitSeq(strings.TrimSuffix(text, "\n"), "\n") {
		if _, err := fmt.Fprintf(l.w, "%s%s\n", prefix, line); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	return nil
}

type prefixWriter struct {
	l      *lines
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	if err := p.l.write(p.prefix, string(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}
