package e2e_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	counterdemo "github.com/sliceplane/sliceplane/examples/counter/demo"
	kvdemo "github.com/sliceplane/sliceplane/examples/kvstore/demo"
	"github.com/sliceplane/sliceplane/examples/targets/demo"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
)

// inspectWriter logs what the demo prints, and hands on its own inspect line (the
// slicectl command that lists the targets).
type inspectWriter struct {
	lineWriter
	inspect chan string
}

func (w inspectWriter) Write(p []byte) (int, error) {
	for line := range strings.SplitSeq(string(p), "\n") {
		if strings.HasPrefix(line, "  inspect:") && strings.Contains(line, " targets ") {
			select {
			case w.inspect <- line:
			default:
			}
		}
	}
	return w.lineWriter.Write(p)
}

// TestTheTwoTargetsDemo runs the two-target demo briefly (real binaries, mutual TLS, a
// throwaway PostgreSQL): the key-value store and the counter on one etcd and two
// assigners. Each demo's check must pass as it does alone, and the slicectl command the
// demo prints, with its admin certificate, must list both targets, each with its leader.
func TestTheTwoTargetsDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries; skipped in -short mode")
	}
	if raceEnabled {
		t.Skip("runs without the race detector, in make test's second step (the binaries it starts are not instrumented either)")
	}
	if err := pgcluster.Installed(); err != nil {
		t.Skipf("the counter needs a PostgreSQL server: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinaries(t, ctx)
	out := inspectWriter{lineWriter: lineWriter{t}, inspect: make(chan string, 1)}
	// A small load, for a short run on a busy machine: the checks are what it is for.
	cfg := demo.Config{Bin: bin, Dir: t.TempDir(), Duration: 6 * time.Second, Out: out,
		KV:      kvdemo.Config{Keys: 2000, ReadRate: 200, WriteRate: 10, Nodes: 2},
		Counter: counterdemo.Config{Members: 2, Keys: 50, Rate: 50}}
	var s demo.Summary
	var err error
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		s, err = demo.Run(ctx, cfg)
	}()
	defer func() { cancel(); <-finished }()
	select {
	case line := <-out.inspect:
		checkTargets(ctx, t, line)
	case <-finished:
		t.Fatalf("the demo ended before it printed its inspect line: %v", err)
	}
	<-finished
	if err != nil {
		t.Fatal(err)
	}
	t.Log(s.KV)
	t.Log(s.Counter)
	if kv := s.KV.String(); !strings.HasSuffix(kv, " lost=0 misses=0 failed=0") {
		t.Errorf("the key-value store: %s, want lost=0 misses=0 failed=0", kv)
	}
	if c := s.Counter.String(); !strings.HasSuffix(c, " duplicates=0 skipped=0 failed=0") || s.Counter.Err() != nil {
		t.Errorf("the counter: %s (%v), want duplicates=0 skipped=0 failed=0", c, s.Counter.Err())
	}
}

// checkTargets runs the slicectl command of the demo's inspect line, as JSON, and checks
// that it lists the default target and the counter's, each with its leader.
func checkTargets(ctx context.Context, t *testing.T, line string) {
	t.Helper()
	command, _, _ := strings.Cut(strings.TrimPrefix(line, "  inspect:"), "  (")
	args := strings.Fields(command)
	if len(args) < 2 || args[len(args)-1] != "targets" {
		t.Fatalf("inspect line %q: want a slicectl command ending in targets", line)
	}
	got, err := exec.CommandContext(ctx, args[0], append(args[1:], "-o", "json")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, got)
	}
	var listed struct {
		Targets []struct{ Name, Leader string }
	}
	if err := json.Unmarshal(got, &listed); err != nil {
		t.Fatalf("%s: %v\n%s", command, err, got)
	}
	t.Logf("%s -o json:\n%s", command, got)
	leaders := map[string]string{}
	for _, tg := range listed.Targets {
		leaders[tg.Name] = tg.Leader
	}
	for _, name := range []string{"default", demo.CounterTarget} {
		if leaders[name] == "" {
			t.Errorf("slicectl targets: %s has no leader, or is not listed:\n%s", name, got)
		}
	}
}
