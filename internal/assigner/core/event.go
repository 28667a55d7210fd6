package core

import (
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// Event is what Core.Step takes: one of the closed set of types in this file. Events are plain
// data, so that a script or a simulator can write any interleaving down, failovers included.
type Event interface{ event() }

// Caller says who made a request, for the audit trail.
type Caller struct {
	// Who is the authenticated caller (authz.Caller); Claims is who the client says it acts
	// for (UserMetadata), unverified.
	Who, Claims string
}

// Requests of nodes.
type (
	// Register adds or updates a node and renews its lease.
	Register struct {
		Caller
		Node Node
	}
	// Heartbeat renews a node's lease. Generation is the map generation of the last delta
	// the node applied and Loading the ranges it holds whose data has not all arrived: with
	// make-before-break, the slices it loads that both show done become serving.
	Heartbeat struct {
		Caller
		Node       assignment.NodeID
		Generation uint64
		Loading    []keyspace.Range
		// Primaries are the ranges a member with roles holds as primary: a demoting primary
		// whose list no longer holds a slice has handed it over. Tokens are their fencing
		// tokens, in the same order.
		Primaries []keyspace.Range
		Tokens    []uint64
		// Report, if set, is the node's load report, counted as ReportLoad counts it; a
		// report refused refuses the heartbeat whole.
		Report *load.Report
	}
	// ReportLoad counts a node's load report (its At is set to the step's time); it renews the
	// node's lease too.
	ReportLoad struct {
		Caller
		Report load.Report
	}
	// Deregister takes a node out at once or, with Grace, keeps it and its slices that long
	// while it restarts with its store (maintenance).
	Deregister struct {
		Caller
		Node  assignment.NodeID
		Grace time.Duration
	}
)

// Admin requests.
type (
	// Move gives a slice a new replica set.
	Move struct {
		Caller
		Slice SliceRef
		To    []assignment.NodeID
	}
	// Split cuts a slice at At, by default its middle.
	Split struct {
		Caller
		Slice SliceRef
		At    *uint64
	}
	// Merge joins two adjacent slices.
	Merge struct {
		Caller
		Left, Right SliceRef
	}
	// Pin keeps a slice's range where it is.
	Pin struct {
		Caller
		Slice SliceRef
	}
	// Unpin removes the pins that overlap a slice.
	Unpin struct {
		Caller
		Slice SliceRef
	}
	// Unquarantine lifts the quarantines that overlap a slice (see quarantine.go).
	Unquarantine struct {
		Caller
		Slice SliceRef
	}
	// Drain empties a node, or with Cancel stops doing so.
	Drain struct {
		Caller
		Node   assignment.NodeID
		Cancel bool
	}
	// Freeze stops balancing passes.
	Freeze struct {
		Caller
		Reason string
	}
	// Unfreeze resumes balancing passes.
	Unfreeze struct{ Caller }
	// SetAlgorithm changes the balancing algorithm or its constants.
	SetAlgorithm struct {
		Caller
		Name   string
		Params map[string]string
	}
)

// Read queries: they never change the core (Core's Status, Nodes, Slices and Explain answer
// the same outside Step).
type (
	GetStatus  struct{ Caller }
	ListNodes  struct{ Caller }
	ListSlices struct {
		Caller
		Node   assignment.NodeID // "" for every node's
		ByLoad bool
		Limit  int
	}
	GetExplain struct{ Caller }
)

// What the driver observes.
type (
	// Tick says time passed: the core runs what is due (expiry and a pass every
	// PassInterval, a clock-only quantum at most every ClockInterval). The driver steps it at
	// Output.Wake; stepping it at other times is harmless.
	Tick struct{}
	// ClockObserved says the source reached Clock: it answers.
	ClockObserved struct{ Clock uint64 }
	// SourceLost says the source's clock cannot be followed now: Err says why, and
	// Misconfigured whether a retry cannot mend it (source.Misconfigured). Balancing passes
	// are held until the next ClockObserved.
	SourceLost struct {
		Err           string
		Misconfigured bool
	}
	// DistributorsChanged gives the set of live distributors.
	DistributorsChanged struct{ Distributors quantum.Distributors }
	// WriteCommitted says Output.Write was persisted.
	WriteCommitted struct{}
	// WriteFailed says Output.Write could not be persisted: the change is dropped.
	WriteFailed struct{ Err error }
	// LeadershipGained starts term Term from the stored state (Found false if none) at the
	// source's Clock. Its output writes the term's claim.
	LeadershipGained struct {
		Term  uint64
		State State
		Found bool
		Clock uint64
	}
	// LeadershipLost ends the term: the core answers nothing but LeadershipGained after it.
	LeadershipLost struct{}
	// LoopStalled says the driver was away for Gap (suspended or starved): every node gets a
	// full lease from now, as under a new leader, since heartbeats may have waited unread.
	LoopStalled struct{ Gap time.Duration }
	// Reconfigure replaces the core's config (the target's target.yaml changed), leading or
	// not: a term begins with it, and a leader's next pass uses it. A new algorithm or new
	// constants are persisted, as SetAlgorithm's are. The role model and the exclusive mode
	// cannot change within a term (ErrInvalid): the driver starts a new one for them.
	Reconfigure struct{ Config Config }
)

func (Register) event()            {}
func (Heartbeat) event()           {}
func (ReportLoad) event()          {}
func (Deregister) event()          {}
func (Move) event()                {}
func (Split) event()               {}
func (Merge) event()               {}
func (Pin) event()                 {}
func (Unpin) event()               {}
func (Unquarantine) event()        {}
func (Drain) event()               {}
func (Freeze) event()              {}
func (Unfreeze) event()            {}
func (SetAlgorithm) event()        {}
func (GetStatus) event()           {}
func (ListNodes) event()           {}
func (ListSlices) event()          {}
func (GetExplain) event()          {}
func (Tick) event()                {}
func (ClockObserved) event()       {}
func (SourceLost) event()          {}
func (DistributorsChanged) event() {}
func (WriteCommitted) event()      {}
func (WriteFailed) event()         {}
func (LeadershipGained) event()    {}
func (LeadershipLost) event()      {}
func (LoopStalled) event()         {}
func (Reconfigure) event()         {}

// Call names a request as the logs, metrics and audit trail do ("drain"), or returns "" for
// an event that is no one's call (and for load reports, too frequent to name).
func Call(ev Event) string {
	switch ev.(type) {
	case Register:
		return "register"
	case Heartbeat:
		return "heartbeat"
	case Deregister:
		return "deregister"
	case Move:
		return "move"
	case Split:
		return "split"
	case Merge:
		return "merge"
	case Pin:
		return "pin"
	case Unpin:
		return "unpin"
	case Unquarantine:
		return "unquarantine"
	case Drain:
		return "drain"
	case Freeze:
		return "freeze"
	case Unfreeze:
		return "unfreeze"
	case SetAlgorithm:
		return "set_algorithm"
	case GetStatus:
		return "status"
	case ListNodes:
		return "list_nodes"
	case ListSlices:
		return "list_slices"
	case GetExplain:
		return "explain"
	}
	return ""
}

// requestEvent is an event someone asked for: Caller, embedded, provides it.
type requestEvent interface {
	Event
	caller() Caller
}

func (c Caller) caller() Caller { return c }

// IsAdmin reports whether a call is an admin change.
func IsAdmin(call string) bool {
	switch call {
	case "move", "split", "merge", "pin", "unpin", "unquarantine", "drain", "freeze", "unfreeze", "set_algorithm":
		return true
	}
	return false
}

// audited reports whether a call changes the cluster on someone's behalf, and so goes into
// the audit trail: every admin change, and nodes joining and leaving.
func audited(call string) bool { return IsAdmin(call) || call == "register" || call == "deregister" }
