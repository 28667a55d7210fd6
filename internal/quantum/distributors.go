package quantum

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// Distributors maps the ID of each live distributor to the address it serves nodes on. Treat
// a set as immutable once published: quanta and hubs share it.
type Distributors map[string]string

// For returns the distributor that serves node n: the one with the highest xxhash64 of its
// ID + "\x00" + n, ties going to the lower ID. This rendezvous hashing needs no stored
// mapping, so the assigner, every distributor and every tool compute the same answer from
// the set alone, and a change of the set moves only the nodes of the distributors that came
// or went.
func (d Distributors) For(n assignment.NodeID) (id, addr string, ok bool) {
	var best uint64
	for cand, a := range d {
		score := rendezvous(cand, string(n))
		if !ok || score > best || score == best && cand < id {
			id, addr, best, ok = cand, a, score, true
		}
	}
	return id, addr, ok
}

// Rank returns the distributors' IDs in the order of For's rendezvous hashing for key: the
// first is the one For would choose for a node named key, and each next one is where key
// goes if all those before it are gone. Routers and members rank the relays so.
func (d Distributors) Rank(key string) []string {
	ids := slices.Collect(maps.Keys(d))
	scores := make(map[string]uint64, len(ids))
	for _, id := range ids {
		scores[id] = rendezvous(id, key)
	}
	slices.SortFunc(ids, func(a, b string) int {
		if c := cmp.Compare(scores[b], scores[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return ids
}

// rendezvous is the score of distributor id for key.
func rendezvous(id, key string) uint64 {
	h := xxhash.New()
	h.WriteString(id)
	h.WriteString("\x00")
	h.WriteString(key)
	return h.Sum64()
}

// Equal reports whether d and o list the same distributors at the same addresses.
func (d Distributors) Equal(o Distributors) bool { return maps.Equal(d, o) }
