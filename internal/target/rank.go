package target

import (
	"cmp"
	"maps"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Rank orders the assigners by their preference to lead target name, by rendezvous (highest
// random weight) hashing: each target ranks every assigner by a hash of the pair, so that
// targets spread evenly, every assigner ranks them alike without talking, and an assigner
// that leaves or joins changes only the targets it was or becomes first for. The first is
// the target's owner, which campaigns for it; the second its backup, which campaigns too, so
// that it is already queued in the election when the owner dies.
func Rank(name string, assigners []string) []string {
	out := slices.Clone(assigners)
	score := func(a string) uint64 { return xxhash.Sum64String(Name(name) + "\x00" + a) }
	slices.SortFunc(out, func(a, b string) int {
		sa, sb := score(a), score(b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return cmp.Compare(a, b)
	})
	return out
}

// Role is what an assigner is to a target: its owner, its backup, or neither.
type Role int

// The roles Of returns.
const (
	Neither Role = iota
	Owner
	Backup
)

// Of returns what assigner self is to a target whose live assigners Rank ranked so: the
// owner and the backup campaign for it, the others only follow who leads it.
func Of(ranked []string, self string) Role {
	switch {
	case len(ranked) > 0 && ranked[0] == self:
		return Owner
	case len(ranked) > 1 && ranked[1] == self:
		return Backup
	}
	return Neither
}

// Sizes returns where the targets' sizes are under the cluster's prefix: <prefix>sizes/,
// each target's number of slices under its name, as its leader publishes it (Place reads
// them).
func Sizes(prefix string) string { return prefix + "sizes/" }

// SizeKey returns where target name's size is (Sizes).
func SizeKey(prefix, name string) string { return Sizes(prefix) + Name(name) }

// HeavySlices is the size from which a target is heavy by default (Place; the assigner's
// --heavy-target-slices): a pass over 50,000 slices
// takes tens of milliseconds of a core (BENCHMARKS.md, Assigner at scale), which every
// other target led by the same assigner would wait for.
const HeavySlices = 50_000

// Place ranks the live assigners for every target of sizes, each target's slices as its
// leader last published them. A heavy target (heavy slices or more) is ranked by Rank among
// all the assigners, and its owner leads it alone: the light targets are ranked by Rank among
// the other assigners, and then the heavy targets' owners, who may only back them up. At
// least one assigner is always left to the light targets. So a target whose passes take a
// core's while runs beside no other; and when an assigner that leads light targets only
// leaves or joins, only the targets it was or becomes first for move, as with Rank alone.
func Place(sizes map[string]int64, assigners []string, heavy int64) map[string][]string {
	out := make(map[string][]string, len(sizes))
	names := slices.Sorted(maps.Keys(sizes))
	// From the largest, so that which heavy targets have an assigner of their own, when
	// there are too many for all, does not depend on the map's order.
	slices.SortStableFunc(names, func(a, b string) int { return cmp.Compare(sizes[b], sizes[a]) })
	reserved := map[string]bool{} // the owners of heavy targets
	for _, name := range names {
		if sizes[name] < heavy || len(reserved) >= len(assigners)-1 {
			break
		}
		ranked := Rank(name, assigners)
		out[name] = ranked
		reserved[ranked[0]] = true
	}
	light := slices.DeleteFunc(slices.Clone(assigners), func(a string) bool { return reserved[a] })
	for _, name := range names {
		if _, done := out[name]; done {
			continue
		}
		ranked := Rank(name, light)
		for _, a := range Rank(name, assigners) {
			if reserved[a] {
				ranked = append(ranked, a)
			}
		}
		out[name] = ranked
	}
	return out
}
