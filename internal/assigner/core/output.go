package core

import (
	"log/slog"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// Output is what one Step asks of the driver, as plain data:
//
//   - Write, if set, is the one write to persist, fenced. The change it carries is held by
//     the core until the driver steps WriteCommitted (the change becomes the state, and its
//     quanta appear in that step's Publish) or WriteFailed (the change is dropped). At most
//     one write is in flight: until then Step refuses every event but those two, a clock
//     observed and leadership lost, with an error reply.
//   - Publish holds the quanta to publish now, in order, each with the map it leads to.
//     A quantum appears only once whatever it announces is persisted, so publishing it in
//     the step's Output is always safe (persist before publish).
//   - Snapshot, if set, asks for the map to be snapshotted as of a log entry: compaction,
//     which the driver may do in the background and which loses nothing if it fails.
//   - Reply, if set, answers the request that started the chain of steps (the event itself,
//     or the write it made, once committed or failed).
//   - Log holds records for the log, the audit trail among them.
//   - Pass is set when a balancing pass ran to its end; PassFailed when one failed.
//   - Handoffs counts the handoffs that committed changes began and ended.
//   - Quarantined counts the ranges that committed changes put in quarantine, and Probes
//     the probes that narrow quarantines, begun and ended.
//   - Wake is when the core next wants a Tick.
type Output struct {
	Write       *Write
	Publish     []Publication
	Snapshot    *Snapshot
	Reply       *Reply
	Log         []Record
	Pass        *PassDone
	PassFailed  bool
	Handoffs    HandoffStats
	Quarantined int
	Probes      ProbeStats
	Wake        time.Time
}

// Write is one change to persist, in order: the node, the nodes deleted, then the map (Init
// stores Map as the first map, Entry logs a change of it) or, with neither, Meta alone if
// SaveMeta. Init and Entry store Meta with them.
type Write struct {
	PutNode     *Node
	DeleteNodes []assignment.NodeID
	Init        bool
	Map         *assignment.Assignment
	Entry       *Entry
	SaveMeta    bool
	Meta        Meta
}

// persists reports whether w writes anything.
func (w *Write) persists() bool {
	return w.PutNode != nil || len(w.DeleteNodes) > 0 || w.Init || w.Entry != nil || w.SaveMeta
}

// Publication is a quantum to publish with the map it leads to.
type Publication struct {
	Quantum quantum.Quantum
	Map     *assignment.Assignment
}

// Snapshot asks for Map to be stored as the map of log entry Index.
type Snapshot struct {
	Index uint64
	Map   *assignment.Assignment
}

// Record is a log line: the driver logs it as it is, with its own attributes (the term).
type Record struct {
	Level slog.Level
	Msg   string
	Attrs []any
}

// PassDone describes a pass that ran: its summary, whether it changed the map, and the
// algorithm's explanation (nil for the first map, which no balancing made).
type PassDone struct {
	Summary     string
	Changed     bool
	Explanation *balance.Explanation
}

// Reply answers a request. Err is the core's verdict (nil: done); the other fields are set
// by the requests they answer.
type Reply struct {
	Err error
	// Register and Heartbeat: the node's lease, whether it drains, and its distributor (nil
	// while there is none).
	TTL time.Duration
	// Lease renews the member's lease on its primary roles in an exclusive cluster; 0: not
	// renewed. Generation is the map's generation then.
	Lease       time.Duration
	Generation  uint64
	Draining    bool
	Distributor *Distributor
	// Admin requests: what changed. Pin and Unpin: the range; Drain: the slices held.
	Change *Change
	Range  keyspace.Range
	Held   int
	// Queries.
	Status  *Status
	Nodes   []NodeInfo
	Slices  []SliceInfo
	Total   int
	Explain *Explanation
}

// Distributor names the distributor that serves a node.
type Distributor struct{ ID, Address string }

// Change describes an admin change once persisted: what it did, the position and generation
// it left the map at, and its operations. Persisted is false when it changed nothing.
type Change struct {
	Summary    string
	Position   quantum.Position
	Generation uint64
	Ops        []assignment.Op
	Persisted  bool
}

// Explanation is the last pass of the term, if Passed, and the passes that failed.
type Explanation struct {
	balance.Explanation
	Passed   bool
	Position quantum.Position
	// Failures counts the passes that failed in a row; Error says why the last failed one
	// did, at ErrorTime (zero if none failed in this term).
	Failures  uint64
	Error     string
	ErrorTime time.Time
	// Quarantined lists the ranges that no pass places on a node (see quarantine.go).
	Quarantined []Quarantine
}
