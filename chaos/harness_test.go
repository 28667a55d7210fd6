package chaos_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The suite's own arithmetic, checked without starting anything.

func TestStaleness(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	log := []written{{rev: 10, at: t0}, {rev: 12, at: t0.Add(time.Second)}, {rev: 20, at: t0.Add(3 * time.Second)}}
	now := t0.Add(5 * time.Second)
	for _, tc := range []struct {
		clock  uint64
		want   time.Duration
		oldest uint64
	}{
		{clock: 0, want: 5 * time.Second, oldest: 10}, // a clock that went back to 0 is as stale as the log is old
		{clock: 10, want: 4 * time.Second, oldest: 12},
		{clock: 11, want: 4 * time.Second, oldest: 12}, // a fence or another writer's revision
		{clock: 19, want: 2 * time.Second, oldest: 20},
		{clock: 20, want: 0},
		{clock: 99, want: 0},
	} {
		got, oldest := staleness(log, tc.clock, now)
		if got != tc.want || oldest != tc.oldest {
			t.Errorf("clock %d: staleness %s (write %d), want %s (write %d)", tc.clock, got, oldest, tc.want, tc.oldest)
		}
	}
	if got, _ := staleness(nil, 0, now); got != 0 {
		t.Errorf("no writes: staleness %s, want 0", got)
	}
}

func TestScheduleIsSeededAndComplete(t *testing.T) {
	t.Setenv("CHAOS_FAULTS", "all")
	t.Setenv("CHAOS_ROUNDS", "3")
	cfg, err := loadConfig(sourceEtcd)
	if err != nil {
		t.Fatal(err)
	}
	names := func(seed uint64) []string {
		var out []string
		for _, f := range cfg.schedule(rand.New(rand.NewPCG(seed, seed))) {
			out = append(out, f.name)
		}
		return out
	}
	a, b, c := names(1), names(1), names(2)
	if !slices.Equal(a, b) {
		t.Errorf("seed 1 gave two schedules:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 1 and 2 gave the same schedule %v", a)
	}
	for round := range 3 {
		got := slices.Sorted(slices.Values(a[round*len(faults) : (round+1)*len(faults)]))
		var want []string
		for _, f := range faults {
			want = append(want, f.name)
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("round %d runs %v, want each fault once: %v", round, got, want)
		}
	}
}

func TestPostgresFaultsRepeat(t *testing.T) {
	t.Setenv("CHAOS_PG_FAULTS", "all")
	cfg, err := loadConfig(sourcePostgres)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, f := range cfg.faults {
		count[f.name]++
	}
	if count["pg-restart"] != 10 || count["pg-outage"] != 3 || len(count) != 2 {
		t.Errorf("CHAOS_PG_FAULTS=all runs %v, want 10 restarts and 3 outages", count)
	}
}

func TestConfigRefusesUnknownFaults(t *testing.T) {
	for env, bad := range map[string][]string{
		"CHAOS_FAULTS":    {"kill-node,kill-everything", "pg-restart", "kill-node*0", "kill-node*x"},
		"CHAOS_PG_FAULTS": {"kill-node", "pg-outage*-1"},
	} {
		src := sourceEtcd
		if env == "CHAOS_PG_FAULTS" {
			src = sourcePostgres
		}
		for _, v := range bad {
			t.Setenv(env, v)
			if _, err := loadConfig(src); err == nil {
				t.Errorf("%s=%s: no error", env, v)
			}
		}
		t.Setenv(env, "")
	}
	t.Setenv("CHAOS_ROUNDS", "0")
	if _, err := loadConfig(sourceEtcd); err == nil {
		t.Error("CHAOS_ROUNDS=0: no error")
	}
}
