package target

import (
	"cmp"
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
