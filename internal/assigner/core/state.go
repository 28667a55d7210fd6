package core

import (
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// The state the core steps over, as it is persisted (see internal/assigner/etcdstate) and
// loaded back by a new leader.

// Keep is how many log entries are kept behind the snapshot, so that a new leader knows the
// moves of the last passes (Weighted-Move's hold_passes must not exceed it).
const Keep = 32

// Meta is the state beside the map.
type Meta struct {
	Term, Seq, Clock, Generation uint64
	LastIndex                    uint64
	Pass                         uint64
	Algorithm                    string
	Params                       map[string]string
	Frozen                       bool
	FreezeReason                 string
	Pins                         []keyspace.Range
	Draining                     []assignment.NodeID
	// Quarantined ranges are held by assignment.Nobody: their holders crashed on them.
	Quarantined []Quarantine
	// Configured is the algorithm and constants of the config a leader last applied
	// (configured): a term whose config gives others applies theirs over Algorithm and
	// Params, so that a SetAlgorithm lasts until the config changes and no longer.
	Configured string
}

// Quarantine is a range taken off every node, since Since, because the holders Nodes (in
// the order they crashed) crashed shortly after acquiring it.
type Quarantine struct {
	Range keyspace.Range
	Since time.Time
	Nodes []assignment.NodeID
}

// Entry is one logged change of the map.
type Entry struct {
	Index, Term, Seq, Clock, Generation uint64
	Cause                               string
	// By is the identity whose call made the change; "" for the assigner's own.
	By    string
	Time  time.Time
	Ops   []assignment.Op
	Moves []balance.Move
}

// Node is a registered node.
type Node struct {
	assignment.Node
	Address string
	Labels  map[string]string
	// Roles is the role model a member expects and acts on (it demotes itself before a
	// primary role moves on, and reports what it holds as primary); "" for a node of the data
	// path, which does not.
	Roles string
	// Incarnation names the process that registered last under the node's ID: a
	// registration under another is a restart. "" when not said.
	Incarnation string
}

// State is everything a new leader needs.
type State struct {
	Meta Meta
	// SnapshotIndex is the log entry the stored snapshot corresponds to.
	SnapshotIndex uint64
	Assignment    *assignment.Assignment
	// History holds the moves of the retained log entries, oldest first.
	History []balance.Move
	Nodes   []Node
}
