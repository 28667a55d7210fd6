package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/examples/kvstore/demo"
)

// lineWriter logs what the demo prints, a line per call.
type lineWriter struct{ t *testing.T }

func (w lineWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestARollingRestartOfTheDemoFailsNoRead runs the demo's cluster (real binaries, mutual
// TLS) with every node restarted in turn under a steady read load, as an orchestrator's
// rolling restart does: each drains on SIGTERM before it stops. No read may fail or miss,
// and the nodes must hold exactly what they must at the end.
func TestARollingRestartOfTheDemoFailsNoRead(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries; skipped in -short mode")
	}
	if raceEnabled {
		t.Skip("runs without the race detector, in make test's second step (the binaries it starts are not instrumented either)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := buildBinaries(t, ctx)
	// Four nodes of about 4 s each (more on a busy machine): the roll starts early and has
	// most of the run to finish.
	s, err := demo.Run(ctx, demo.Config{Bin: bin, Dir: t.TempDir(), Duration: 40 * time.Second, Keys: 3000,
		ReadRate: 400, WriteRate: 20, Roll: true, RollAfter: 3 * time.Second, Out: lineWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(s)
	if s.Rolled != 4 {
		t.Fatalf("the roll restarted %d nodes of 4", s.Rolled)
	}
	if s.Failed != 0 || s.Misses != 0 {
		t.Errorf("under a rolling restart, %d reads failed and %d missed; want none", s.Failed, s.Misses)
	}
	if s.Lost+s.Leaked+s.Stale != 0 {
		t.Errorf("the nodes do not hold what they must: %s", s)
	}
}
