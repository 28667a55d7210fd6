package assignment

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// NodeID names a storage node. It is 1–128 characters of letters, digits and . _ - :, so that
// it can be written in flags and lists (a,b,c) without quoting.
type NodeID string

// Nobody is the holder of a slice that no node may serve: a quarantined range (a key of
// death, whose holders crash) stays in the map, as every point of the space must, but on no
// live node. It is a well-formed ID so that every reader of the map takes it as it is; the
// assigner refuses a node that registers under it, and routers answer its keys as
// unavailable.
const Nobody NodeID = "-"

// Validate reports whether id is well formed.
func (id NodeID) Validate() error {
	if len(id) == 0 || len(id) > 128 {
		return fmt.Errorf("%w: %q must be 1 to 128 characters", ErrBadNodeID, string(id))
	}
	for _, c := range []byte(id) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-' || c == ':'
		if !ok {
			return fmt.Errorf("%w: %q has %q; use letters, digits, '.', '_', '-' and ':'", ErrBadNodeID, string(id), c)
		}
	}
	return nil
}

// Node is a storage node that can hold slices.
type Node struct {
	ID NodeID
	// Capacity weighs how much load the node should carry relative to others. Zero means the
	// default weight, 1.
	Capacity float64
}

// Weight returns the node's capacity, with zero read as the default 1.
func (n Node) Weight() float64 {
	if n.Capacity == 0 {
		return 1
	}
	return n.Capacity
}

// Validate reports whether the node's ID and capacity are usable.
func (n Node) Validate() error {
	if err := n.ID.Validate(); err != nil {
		return err
	}
	if math.IsNaN(n.Capacity) || math.IsInf(n.Capacity, 0) || n.Capacity < 0 {
		return fmt.Errorf("%w: node %s has capacity %v; want a finite number >= 0 (0 means 1)",
			ErrBadCapacity, n.ID, n.Capacity)
	}
	return nil
}

// NodeSet is an immutable set of nodes, ordered by ID.
type NodeSet struct {
	list  []Node
	index map[NodeID]int
}

// NewNodeSet validates nodes and returns them as a set. IDs must be unique.
func NewNodeSet(nodes []Node) (*NodeSet, error) {
	s := &NodeSet{list: slices.Clone(nodes), index: make(map[NodeID]int, len(nodes))}
	slices.SortFunc(s.list, func(a, b Node) int { return cmp.Compare(a.ID, b.ID) })
	for i, n := range s.list {
		if err := n.Validate(); err != nil {
			return nil, err
		}
		if i > 0 && s.list[i-1].ID == n.ID {
			return nil, fmt.Errorf("%w: node %s is listed twice", ErrDuplicateNode, n.ID)
		}
		s.index[n.ID] = i
	}
	return s, nil
}

// MustNodeSet is NewNodeSet for inputs known to be valid, such as test fixtures.
func MustNodeSet(nodes ...Node) *NodeSet {
	s, err := NewNodeSet(nodes)
	if err != nil {
		panic(err)
	}
	return s
}

// Len returns the number of nodes.
func (s *NodeSet) Len() int { return len(s.list) }

// Nodes returns the nodes ordered by ID. The caller must not modify the result.
func (s *NodeSet) Nodes() []Node { return s.list }

// Index returns the position of id in Nodes, and whether the set holds it.
func (s *NodeSet) Index(id NodeID) (int, bool) {
	i, ok := s.index[id]
	return i, ok
}

// AppendIndices appends to dst the index of each of ids that the set holds, in the order of
// ids, and returns the extended slice: the live replicas of a slice, without allocating when
// dst has room.
func (s *NodeSet) AppendIndices(dst []int, ids []NodeID) []int {
	for _, id := range ids {
		if i, ok := s.index[id]; ok {
			dst = append(dst, i)
		}
	}
	return dst
}

// Has reports whether the set holds id.
func (s *NodeSet) Has(id NodeID) bool {
	_, ok := s.index[id]
	return ok
}

// IDs returns the node IDs in order.
func (s *NodeSet) IDs() []NodeID {
	ids := make([]NodeID, len(s.list))
	for i, n := range s.list {
		ids[i] = n.ID
	}
	return ids
}
