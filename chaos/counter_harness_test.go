package chaos_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/examples/counter/countercheck"
)

// The counter run's arithmetic, checked without starting anything.

func TestLongestGap(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms ...int) []time.Time {
		var out []time.Time
		for _, m := range ms {
			out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		acks     []time.Time
		from, to int
		want     time.Duration
	}{
		{"the gap across the fault's start", at(0, 300, 3300, 3600), 1000, 4000, 3000 * time.Millisecond},
		{"a gap before the last answer at or before from does not count", at(0, 5000, 5100, 5200), 5050, 6000, 100 * time.Millisecond},
		{"answers after to do not count", at(900, 1200, 9000), 1000, 2000, 300 * time.Millisecond},
		{"no answer before from: counted from from", at(1500, 1600), 1000, 2000, 500 * time.Millisecond},
	} {
		got := longestGap(tc.acks, t0.Add(time.Duration(tc.from)*time.Millisecond), t0.Add(time.Duration(tc.to)*time.Millisecond))
		if got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// attribute's totals are countercheck's, and each duplicate and skipped count lands in the
// row of the answer that showed it.
func TestAttributeAddsUpToCountercheck(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	rows := []counterRow{{start: s(10), end: s(20)}, {start: s(30), end: s(40)}}
	events := []incrEvent{
		{key: "a", at: s(1), count: 1, ok: true}, {key: "a", at: s(2), count: 2, ok: true},
		{key: "a", at: s(11), count: 3, ok: true}, {key: "a", at: s(12), count: 3, ok: true}, // a duplicate in row 0
		{key: "a", at: s(31), count: 6, ok: true}, // 4 and 5 skipped in row 1; one failure excuses one
		{key: "a", at: s(32)},
		{key: "b", at: s(25), count: 2, ok: true}, // 1 skipped between the rows
	}
	got := attribute(events, rows)
	want := map[int]tally{0: {acked: 2, duplicates: 1}, 1: {acked: 1, failed: 1, skipped: 1}, -1: {acked: 3, skipped: 1}}
	for i, w := range want {
		if got[i] == nil || *got[i] != w {
			t.Errorf("row %d: %+v, want %+v", i, got[i], w)
		}
	}
	h := countercheck.NewHistory()
	for _, e := range events {
		if e.ok {
			h.Acked(e.key, e.count, "m")
		} else {
			h.Failed(e.key)
		}
	}
	res := h.Check(map[string]int64{"a": 6, "b": 2})
	var sum tally
	for _, tl := range got {
		sum.add(tl)
	}
	if sum.duplicates != res.Duplicates || sum.skipped != res.Skipped || sum.acked != res.Acked || sum.failed != res.Failed {
		t.Errorf("attributed %+v, countercheck %s", sum, res)
	}
}

// A window open when an incarnation was killed ends at its death; the current
// incarnation's stays open; a lease that ended closes windows as countercheck says.
func TestIncarnationWindowsCloseAtDeath(t *testing.T) {
	line := func(sec int, msg, start string) string {
		return fmt.Sprintf(`{"time":"2026-11-27T10:00:%02dZ","msg":%q,"start":%q,"end":"","token":1}`+"\n", sec, msg, start)
	}
	log := "### 2026-11-27T10:00:00Z countermember --id c1\n" +
		line(1, "primary from", "0000000000000000") +
		"### 2026-11-27T10:00:09Z countermember --id c1\n" +
		line(10, "primary from", "8000000000000000")
	death := time.Date(2026, 11, 27, 10, 0, 5, 0, time.UTC)
	ws, err := incarnationWindows("c1", log, []time.Time{death})
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || !ws[0].Until.Equal(death) || ws[1].Until.Year() < 2030 {
		t.Fatalf("windows %v: want the first closed at %s, the second open", ws, death)
	}
	other := []countercheck.Window{{Member: "c2", Start: 0, End: 1 << 62, From: death.Add(time.Second), Until: death.Add(time.Hour)}}
	if o := countercheck.Overlaps(append(ws, other...)); len(o) != 0 {
		t.Errorf("a successor after the death overlaps: %v", o)
	}
}

func TestCounterFaultsConfig(t *testing.T) {
	t.Setenv("CHAOS_COUNTER_FAULTS", "")
	cfg, err := loadCounterConfig()
	if err != nil || len(cfg.kinds) != 2 || !cfg.exclusive {
		t.Fatalf("default: %d faults, exclusive %v, %v; want the quick two, exclusive", len(cfg.kinds), cfg.exclusive, err)
	}
	t.Setenv("CHAOS_COUNTER_FAULTS", "all")
	t.Setenv("CHAOS_COUNTER_EXCLUSIVE", "0")
	if cfg, err = loadCounterConfig(); err != nil || len(cfg.kinds) != len(counterFaults) || cfg.exclusive {
		t.Fatalf("all, not exclusive: %d faults, exclusive %v, %v", len(cfg.kinds), cfg.exclusive, err)
	}
	var names []string
	for _, f := range counterFaults {
		names = append(names, f.name)
	}
	for _, want := range []string{"kill-primary", "stop-primary", "partition-primary", "kill-assigner", "stop-assigner", "kill-etcd-leader", "roll"} {
		if !slices.Contains(names, want) {
			t.Errorf("no fault %s", want)
		}
	}
	t.Setenv("CHAOS_COUNTER_FAULTS", "kill-node")
	if _, err := loadCounterConfig(); err == nil {
		t.Error("CHAOS_COUNTER_FAULTS=kill-node: no error")
	}
}
