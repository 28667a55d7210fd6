package balance

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// TestPinSweepAgreesWithPinned checks the sweep over sorted slices against the plain scan of
// every pin, on random pins (overlapping, adjacent, reaching the end of the space) and maps.
func TestPinSweepAgreesWithPinned(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	rangeOf := func(a, b uint64) keyspace.Range {
		if a > b {
			a, b = b, a
		}
		r := keyspace.Range{Start: a, End: keyspace.At(b)}
		if b%5 == 0 {
			r.End = keyspace.End
		}
		if !r.Valid() {
			r.End = keyspace.At(a + 1)
		}
		return r
	}
	for round := range 500 {
		const space = 64 // small, so that pins touch and overlap often
		var in Input
		for range rng.IntN(6) {
			in.Pinned = append(in.Pinned, rangeOf(rng.Uint64N(space), rng.Uint64N(space)))
		}
		cuts := []uint64{0}
		for p := range uint64(space) {
			if p > 0 && rng.IntN(3) == 0 {
				cuts = append(cuts, p)
			}
		}
		sweep := newPinSweep(slices.Clone(in.Pinned))
		for i, c := range cuts {
			r := keyspace.Range{Start: c, End: keyspace.End}
			if i+1 < len(cuts) {
				r.End = keyspace.At(cuts[i+1])
			}
			if got, want := sweep.overlaps(r), in.pinned(r); got != want {
				t.Fatalf("round %d: pins %v, slice %s: sweep says %t, scan %t", round, in.Pinned, r, got, want)
			}
		}
	}
}
