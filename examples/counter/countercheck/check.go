// Package countercheck is the check of a counter's history that Jepsen's counter workload
// makes: per key, the counts acknowledged to increments must be exactly 1..N, none twice
// and none skipped, and the store must hold N. An increment that got no answer (an error, a
// timeout) may or may not have happened: it excuses one gap in its key's counts, and one
// more in what the store holds.
package countercheck

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// History records the outcome of every increment. Its methods are safe for concurrent use.
type History struct {
	mu     sync.Mutex
	acked  map[string][]int64
	failed map[string]int64
	// by says who answered each count of each key, for the report of a duplicate.
	by map[string][]string
}

// NewHistory returns an empty history.
func NewHistory() *History {
	return &History{acked: map[string][]int64{}, failed: map[string]int64{}, by: map[string][]string{}}
}

// Acked records that an increment of key was answered with count n, by who.
func (h *History) Acked(key string, n int64, who string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acked[key] = append(h.acked[key], n)
	h.by[key] = append(h.by[key], fmt.Sprintf("%d by %s at %s", n, who, time.Now().Format("15:04:05.000")))
}

// Duplicates describes, for each count answered more than once, who answered it and when.
func (h *History) Duplicates() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for k, ns := range h.acked {
		seen := map[int64]int{}
		for _, n := range ns {
			seen[n]++
		}
		for i, n := range ns {
			if seen[n] > 1 {
				out = append(out, fmt.Sprintf("%s: %s", k, h.by[k][i]))
			}
		}
	}
	slices.Sort(out)
	return out
}

// Failed records that an increment of key got no answer, or an error.
func (h *History) Failed(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed[key]++
}

// Result is what Check found.
type Result struct {
	// Keys incremented; Acked, the increments answered; Stored, the sum of the counts the
	// store holds for those keys; Failed, the increments with an error or no answer.
	Keys, Acked, Stored, Failed int64
	// Duplicates are counts answered more than once for a key (each extra answer counts);
	// Skipped, counts below a key's highest answered one that no answer gave and no failed
	// increment excuses; Excused, the gaps failed increments excused.
	Duplicates, Skipped, Excused int64
	// Lost counts keys whose stored count is below their highest answered one (an
	// acknowledged increment lost) or above it by more than their failed increments.
	Lost int64
}

// OK reports whether the history is a counter's.
func (r Result) OK() bool { return r.Duplicates+r.Skipped+r.Lost == 0 }

func (r Result) String() string {
	return fmt.Sprintf("keys=%d acked=%d stored=%d duplicates=%d skipped=%d failed=%d", r.Keys, r.Acked, r.Stored,
		r.Duplicates, r.Skipped, r.Failed)
}

// Check checks the history against the counts the store holds, by key (a key missing
// from stored holds 0).
func (h *History) Check(stored map[string]int64) Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	var res Result
	keys := map[string]bool{}
	for k := range h.acked {
		keys[k] = true
	}
	for k := range h.failed {
		keys[k] = true
	}
	for k := range keys {
		res.Keys++
		res.Stored += stored[k]
		res.add(checkKey(slices.Clone(h.acked[k]), h.failed[k], stored[k]))
	}
	return res
}

func (r *Result) add(o Result) {
	r.Acked += o.Acked
	r.Failed += o.Failed
	r.Duplicates += o.Duplicates
	r.Skipped += o.Skipped
	r.Excused += o.Excused
	r.Lost += o.Lost
}

// checkKey checks one key's answered counts, its failed increments and its stored count.
func checkKey(acked []int64, failed, stored int64) Result {
	res := Result{Acked: int64(len(acked)), Failed: failed}
	slices.Sort(acked)
	var top, gaps int64
	for i, n := range acked {
		switch {
		case i > 0 && n == acked[i-1]:
			res.Duplicates++
		case n < 1:
			res.Skipped++ // no increment answers 0 or less
		default:
			gaps += n - top - 1
			top = n
		}
	}
	res.Excused = min(gaps, failed)
	res.Skipped += gaps - res.Excused
	if stored < top || stored > top+failed-res.Excused {
		res.Lost++
	}
	return res
}
