package quantum

import (
	"fmt"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// Why a follower refuses a quantum, as metrics label it.
const (
	// StaleTerm: from a term older than one applied. Only a deposed leader still sends one,
	// and its map may undo the new leader's changes (fencing).
	StaleTerm = "stale_term"
	// Stale: a reinitializing quantum that goes back within a term.
	Stale = "stale"
	// OutOfSequence: operations that do not follow the position held. Operations only make
	// sense within a term, on the map they were made for.
	OutOfSequence = "out_of_sequence"
)

// RefusedError is a quantum that does not follow a follower's position.
type RefusedError struct {
	Reason   string // StaleTerm, Stale or OutOfSequence
	Quantum  Position
	Position Position // the follower's
	Holder   string   // names the follower: "the router"
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("quantum %s refused (%s): %s is at %s", e.Quantum, e.Reason, e.Holder, e.Position)
}

// Precedes reports whether q comes right after p in the same term.
func (p Position) Precedes(q Position) bool { return q.Term == p.Term && q.Seq == p.Seq+1 }

// Follower is where a follower of the stream stands: every one (the client's router, a
// relay, a distributor's router) admits a quantum by the same rule, here.
type Follower struct {
	// Pos is the position of the last quantum applied; Started is false before the first.
	Pos     Position
	Started bool
	// Every says the follower takes every quantum (a relay, whose hub republishes them), so
	// operations must come right after Pos. The others skip clock-only quanta: any later
	// position of the term will do, and Next's generation check finds a change they missed.
	Every bool
	// Holder names the follower in errors: "the router".
	Holder string
}

// Admit reports whether q may follow: nil, or a *RefusedError saying why not.
func (f Follower) Admit(q Quantum) error {
	if !f.Started {
		return nil // whatever comes first, Next judges whether it carries a map
	}
	after := f.Pos.Less(q.Position)
	if f.Every {
		after = f.Pos.Precedes(q.Position)
	}
	reason := ""
	switch {
	case q.Term < f.Pos.Term:
		reason = StaleTerm
	case q.Snapshot != nil && q.Position.Less(f.Pos):
		reason = Stale
	case q.Snapshot == nil && (q.Term != f.Pos.Term || !after):
		reason = OutOfSequence
	default:
		return nil
	}
	return &RefusedError{Reason: reason, Quantum: q.Position, Position: f.Pos, Holder: f.Holder}
}

// Follow admits q and returns the map it leads to from cur, the follower's (see Next).
func (f Follower) Follow(cur *assignment.Assignment, q Quantum) (*assignment.Assignment, error) {
	if err := f.Admit(q); err != nil {
		return nil, err
	}
	return q.Next(cur, f.Holder)
}
