package quantum

import (
	"maps"

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
		h := xxhash.New()
		h.WriteString(cand)
		h.WriteString("\x00")
		h.WriteString(string(n))
		score := h.Sum64()
		if !ok || score > best || score == best && cand < id {
			id, addr, best, ok = cand, a, score, true
		}
	}
	return id, addr, ok
}

// Equal reports whether d and o list the same distributors at the same addresses.
func (d Distributors) Equal(o Distributors) bool { return maps.Equal(d, o) }
