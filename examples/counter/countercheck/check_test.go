package countercheck

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCheckFindsWhatACounterMustNotDo(t *testing.T) {
	for _, tc := range []struct {
		name   string
		acked  []int64
		failed int64
		stored int64
		want   Result
	}{
		{name: "1..N", acked: []int64{3, 1, 2}, stored: 3, want: Result{Acked: 3}},
		{name: "a duplicate", acked: []int64{1, 2, 2, 3}, stored: 3, want: Result{Acked: 4, Duplicates: 1}},
		{name: "a gap", acked: []int64{1, 3}, stored: 3, want: Result{Acked: 2, Skipped: 1}},
		{name: "a gap a failure excuses", acked: []int64{1, 3}, failed: 1, stored: 3, want: Result{Acked: 2, Failed: 1, Excused: 1}},
		{name: "two gaps, one failure", acked: []int64{1, 4}, failed: 1, stored: 4, want: Result{Acked: 2, Failed: 1, Excused: 1, Skipped: 1}},
		{name: "a failure that happened last", acked: []int64{1, 2}, failed: 1, stored: 3, want: Result{Acked: 2, Failed: 1}},
		{name: "an acknowledged increment lost", acked: []int64{1, 2}, stored: 1, want: Result{Acked: 2, Lost: 1}},
		{name: "more stored than answered and failed", acked: []int64{1}, failed: 1, stored: 3, want: Result{Acked: 1, Failed: 1, Lost: 1}},
		{name: "a zero answered", acked: []int64{0, 1}, stored: 1, want: Result{Acked: 2, Skipped: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistory()
			for _, n := range tc.acked {
				h.Acked("k", n, "m")
			}
			for range tc.failed {
				h.Failed("k")
			}
			got := h.Check(map[string]int64{"k": tc.stored})
			tc.want.Keys, tc.want.Stored = 1, tc.stored
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want.Duplicates+tc.want.Skipped+tc.want.Lost == 0, got.OK())
		})
	}
}
