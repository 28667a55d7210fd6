package loadgen

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFillWritesEveryKeyOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := writer.New(etcdtest.New(t), writer.DefaultPrefix)
	g, err := New(Config{Writer: w, Keys: 250})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Fill(ctx); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 99, 100, 249} {
		it, ok, err := w.Get(ctx, Key(i))
		if err != nil || !ok {
			t.Fatalf("key %d: held %v, %v", i, ok, err)
		}
		if want := fmt.Sprintf("key-%d=v0", i); string(it.Value) != want {
			t.Errorf("key %d = %q, want %q", i, it.Value, want)
		}
	}
	if _, ok, _ := w.Get(ctx, Key(250)); ok {
		t.Error("key 250 written; want 250 keys")
	}
	if s := g.Stats(); s.Writes != 250 {
		t.Errorf("%d writes counted, want 250", s.Writes)
	}
}

// TestPickFollowsTheWorkload draws keys and compares their frequencies with the popularity
// the workload gives them, before and after the hotspot moves.
func TestPickFollowsTheWorkload(t *testing.T) {
	const keys, draws = 1000, 200000
	g, err := New(Config{Writer: &writer.Writer{}, Keys: keys, Workload: "hotspot-shift:1.1:5", Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	for _, epoch := range []int{0, 5} {
		loads := make([]float64, keys)
		g.workload.Fill(epoch, loads)
		var total float64
		hottest := 0
		for i, l := range loads {
			total += l
			if l > loads[hottest] {
				hottest = i
			}
		}
		counts := make([]int, keys)
		for range draws {
			counts[g.pick(epoch)]++
		}
		want := loads[hottest] / total
		got := float64(counts[hottest]) / draws
		if got < 0.9*want || got > 1.1*want {
			t.Errorf("epoch %d: the hottest key %d drawn %.4f of the time, want %.4f", epoch, hottest, got, want)
		}
		t.Logf("epoch %d: hottest key %d, share %.4f (want %.4f)", epoch, hottest, got, want)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	w := &writer.Writer{}
	for _, c := range []Config{
		{Keys: 10},
		{Writer: w},
		{Writer: w, Keys: 10, ReadRate: -1},
		{Writer: w, Keys: 10, Workload: "zipf"},
		{Writer: w, Keys: 10, Epoch: -time.Second},
		{Writer: w, Keys: 10, DeleteShare: 1.5},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v): want an error", c)
		}
	}
	g, err := New(Config{Writer: w, Keys: 10, ReadRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background()); err == nil {
		t.Error("Run reading without a router: want an error")
	}
}
