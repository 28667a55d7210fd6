package demo

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
)

// Each demo's lines begin with its name, a write of several lines too, and the lines of
// demos that print at once do not mix.
func TestEveryLineBeginsWithItsDemosName(t *testing.T) {
	var buf bytes.Buffer
	out := &lines{w: &buf}
	kv, counter := out.prefixed(kvPrefix), out.prefixed(counterPrefix)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { fmt.Fprintf(kv, "frame %d\n  n1 %d\n  n2 %d\n", i, i, i) })
		wg.Go(func() { fmt.Fprintf(counter, "%ds sent=%d\n", i, i) })
	}
	wg.Wait()
	out.say("  inspect:   slicectl targets")
	got := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(got) != 50*4+1 {
		t.Fatalf("%d lines, want %d:\n%s", len(got), 50*4+1, buf.String())
	}
	for _, line := range got[:len(got)-1] {
		kvLine := strings.HasPrefix(line, kvPrefix+"frame ") || strings.HasPrefix(line, kvPrefix+"  n")
		if !kvLine && !strings.HasPrefix(line, counterPrefix) || strings.Count(line, "[") != 1 {
			t.Errorf("line %q", line)
		}
	}
	if last := got[len(got)-1]; last != "  inspect:   slicectl targets" {
		t.Errorf("the demo's own line: %q", last)
	}
}

// Each example's demo joins the plane: the key-value store as the default target, the
// counter as CounterTarget, both with the demo's binaries, directory, duration and stop.
func TestEachDemoJoinsThePlane(t *testing.T) {
	stop := make(chan struct{})
	plane := &kvcluster.Plane{}
	cfg := Config{Bin: "bin", Dir: "dir", Duration: 7, Stop: stop}
	cfg.KV.Keys, cfg.Counter.Keys = 5, 6
	out := &lines{w: &bytes.Buffer{}}
	kv, counter := kvConfig(cfg, plane, out), counterConfig(cfg, plane, out)
	if kv.Plane != plane || kv.Bin != "bin" || kv.Dir != "dir" || kv.Duration != 7 || kv.Stop != stop || kv.Keys != 5 {
		t.Errorf("the key-value store's demo: %+v", kv)
	}
	if counter.Plane != plane || counter.Target != CounterTarget || counter.Bin != "bin" || counter.Dir != "dir" ||
		counter.Duration != 7 || counter.Stop != stop || counter.Keys != 6 {
		t.Errorf("the counter's demo: %+v", counter)
	}
}
