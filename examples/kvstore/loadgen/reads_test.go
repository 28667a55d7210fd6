package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient/kvclienttest"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// outcome is what one read added to the stats.
type outcome struct {
	hits, misses, absent, failed, misdirected, stale, errors uint64
	servedBy                                                 string
}

func delta(before, after Stats) outcome {
	o := outcome{hits: after.Hits - before.Hits, misses: after.Misses - before.Misses, absent: after.Absent - before.Absent,
		failed: after.Failed - before.Failed, misdirected: after.Misdirected - before.Misdirected,
		stale: after.Stale - before.Stale, errors: after.Errors - before.Errors}
	for id, n := range after.Served {
		if n != before.Served[id] {
			o.servedBy = id
		}
	}
	return o
}

// fakeCluster is two fake nodes holding every key, a the policy's pick, and a generator
// reading them whose keys were filled, key 5 then deleted.
func fakeCluster(t *testing.T) (*Generator, *kvclienttest.Node, *kvclienttest.Node) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := kvclienttest.NewNode(t, "a", kvclienttest.Value)
	b := kvclienttest.NewNode(t, "b", kvclienttest.Value)
	// Only Hang answers reach the timeout, and they must make the read move on.
	g, err := New(Config{Writer: writer.New(etcdtest.New(t), writer.DefaultPrefix), Router: kvclienttest.NewRouter(a, b),
		Keys: 8, HTTP: &http.Client{Timeout: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Fill(ctx); err != nil {
		t.Fatal(err)
	}
	g.change(ctx, 5, true)
	if s := g.Stats(); s.Writes != 8 || s.Deletes != 1 || s.WriteErrors != 0 {
		t.Fatalf("stats after the fill and a delete: %+v", s)
	}
	return g, a, b
}

// TestReadsAreCountedByOutcome reads keys from fake nodes answering each way a node can, and
// checks what each read counts.
func TestReadsAreCountedByOutcome(t *testing.T) {
	g, a, b := fakeCluster(t)
	a.SetOwners(b)
	V, NF, NM, ST, F, H := kvclienttest.Value, kvclienttest.NotFound, kvclienttest.NotMine,
		kvclienttest.Stale, kvclienttest.Fail, kvclienttest.Hang
	for _, c := range []struct {
		name string
		key  int
		a, b kvclienttest.Answer
		want outcome
	}{
		{"the pick answers", 0, V, V, outcome{hits: 1, servedBy: "a"}},
		{"an existing key not found", 1, NF, V, outcome{misses: 1}},
		{"a deleted key not found", 5, NF, V, outcome{absent: 1}},
		{"misdirected, then answered by the owner named", 2, NM, V, outcome{hits: 1, misdirected: 1, servedBy: "b"}},
		{"misdirected, then not found at the owner", 2, NM, NF, outcome{misses: 1, misdirected: 1}},
		{"beyond freshness, then answered by another replica", 3, ST, V, outcome{hits: 1, stale: 1, servedBy: "b"}},
		{"an error, then answered by another replica", 4, F, V, outcome{hits: 1, errors: 1, servedBy: "b"}},
		{"a timeout, then not found at another replica", 4, H, NF, outcome{misses: 1, errors: 1}},
		{"every replica beyond freshness", 3, ST, ST, outcome{failed: 1, stale: 2}},
		{"misdirected everywhere", 6, NM, NM, outcome{failed: 1, misdirected: 2}},
		{"an error and a timeout", 7, F, H, outcome{failed: 1, errors: 2}},
	} {
		a.Set(c.a)
		b.Set(c.b)
		before := g.Stats()
		g.read(context.Background(), c.key)
		after := g.Stats()
		if got := delta(before, after); got != c.want {
			t.Errorf("%s: counted %+v, want %+v", c.name, got, c.want)
		}
		if after.Reads != before.Reads+1 {
			t.Errorf("%s: %d reads counted, want 1", c.name, after.Reads-before.Reads)
		}
	}
	s := g.Stats()
	if s.Reads != s.Hits+s.Misses+s.Absent+s.Failed {
		t.Errorf("%d reads, but %d hits + %d misses + %d absent + %d failed", s.Reads, s.Hits, s.Misses, s.Absent, s.Failed)
	}
}

// A key that was never written, or whose delete began while the read ran, is not a miss.
func TestNotFoundIsAMissOnlyForAKeyThatExistedThroughout(t *testing.T) {
	g, a, _ := fakeCluster(t)
	ctx := context.Background()
	a.Set(kvclienttest.NotFound)
	gate := make(chan struct{})
	a.HoldUntil(gate)
	go func() {
		<-a.Waiting() // the read has begun: delete its key, then answer it
		g.change(ctx, 1, true)
		close(gate)
	}()
	before := g.Stats()
	g.read(ctx, 1)
	a.HoldUntil(nil)
	if got, want := delta(before, g.Stats()), (outcome{absent: 1}); got != want {
		t.Errorf("a key deleted during the read: counted %+v, want %+v", got, want)
	}
	// Written again, the key exists again.
	g.change(ctx, 1, false)
	before = g.Stats()
	g.read(ctx, 1)
	if got, want := delta(before, g.Stats()), (outcome{misses: 1}); got != want {
		t.Errorf("a key written again: counted %+v, want %+v", got, want)
	}

	// A generator that did not fill knows of no key, unless told they were filled before.
	for _, filled := range []bool{false, true} {
		fresh, err := New(Config{Writer: &writer.Writer{}, Router: kvclienttest.NewRouter(a), Keys: 8, Filled: filled})
		if err != nil {
			t.Fatal(err)
		}
		fresh.read(ctx, 2)
		want := outcome{absent: 1}
		if filled {
			want = outcome{misses: 1}
		}
		if got := delta(Stats{}, fresh.Stats()); got != want {
			t.Errorf("filled %v: counted %+v, want %+v", filled, got, want)
		}
	}
}

// TestRunCountsEveryRead runs the load against fake nodes and checks that every read ended
// as one outcome, and that the served counts are the hits.
func TestRunCountsEveryRead(t *testing.T) {
	a := kvclienttest.NewNode(t, "a", kvclienttest.Value)
	b := kvclienttest.NewNode(t, "b", kvclienttest.Value)
	for i := 0; i < 100; i += 3 {
		a.SetKey(string(Key(i)), kvclienttest.Stale)
	}
	router := kvclienttest.NewRouter(a, b)
	g, err := New(Config{Writer: &writer.Writer{}, Router: router, Keys: 100, Filled: true, ReadRate: 1000, Workload: "uniform", Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx) }()
	err = launch.WaitFor(ctx, "300 reads", 10*time.Millisecond, func(context.Context) error {
		if n := g.Stats().Reads; n < 300 {
			return fmt.Errorf("%d reads", n)
		}
		return nil
	})
	stop()
	if rerr := <-done; rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := g.Stats()
	if s.Hits != s.Reads || s.Misses+s.Absent+s.Failed != 0 {
		t.Errorf("every read should hit: %+v", s)
	}
	if s.Served["a"]+s.Served["b"] != s.Hits || s.Stale == 0 || s.Served["b"] < s.Stale {
		t.Errorf("served %v for %d hits, %d stale answers retried on b", s.Served, s.Hits, s.Stale)
	}
	if _, inFlight := router.Requests(); inFlight != 0 {
		t.Errorf("%d requests still in flight after Run", inFlight)
	}
}
