package distributor

import (
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

// Sequencer puts quanta and source changes in causal order (I2, docs/DESIGN.md, "The causal
// ordering rule"): every change with a clock <= a quantum's clock comes before the quantum.
// Quanta and changes each arrive in clock order, from different streams. A quantum waits
// until the source is known to have delivered everything up to its clock; a change waits
// for nothing but the first quantum (until then there is no map to route it by), and is
// routed by the map of the quanta released so far.
//
// So a quantum q is applied at a cut of the change stream at or after q's clock: the clock
// of the last change released before it (or q's clock, if that is later). Every change up to
// the cut comes before q, every later one after it, and the router scans the slices q gives
// at the cut. Changes never wait for the assigner: while it fails over, and no quantum comes,
// they still reach the nodes, by the last map known.
//
// The source says how far it has delivered with each batch, and with batches that carry no
// change (progress marks), which Waiting says are needed.
type Sequencer struct {
	quanta  []quantum.Quantum
	batches []source.Batch
	seen    uint64 // every change with a clock <= seen has been added
	bytes   int    // of the changes held
	mapped  bool   // a quantum was released: changes have a map to be routed by
	// open is the clock of a batch marked More: its changes go on in the next batches, and
	// seen stays below it until the last.
	open uint64
	// midway says that some but not all batches of a clock were released: no quantum may go
	// until the last has, or the quantum would split a transaction's changes.
	midway bool
}

// NewSequencer returns a sequencer whose source delivers changes after clock from.
func NewSequencer(from uint64) *Sequencer { return &Sequencer{seen: from} }

// AddQuantum adds the next quantum.
func (s *Sequencer) AddQuantum(q quantum.Quantum) { s.quanta = append(s.quanta, q) }

// AddBatch adds the next batch of the source: changes with one clock, or a progress mark
// without changes. Batches at or below the clock already seen are dropped: the source
// delivered them before (a restarted watch may repeat a mark). A batch marked More is
// followed by more of its clock; the clock counts as seen with the last.
func (s *Sequencer) AddBatch(b source.Batch) {
	if b.Clock <= s.seen || s.open != 0 && b.Clock != s.open {
		return
	}
	if b.More {
		s.open = b.Clock
	} else {
		s.seen, s.open = b.Clock, 0
	}
	if len(b.Changes) == 0 {
		return // a progress mark: it says all there is to say by advancing seen
	}
	s.batches = append(s.batches, b)
	s.bytes += batchBytes(b)
}

// Rebase forgets the changes held and takes the source as delivered up to clock, after a
// watch that had to restart from there (the changes before it are lost: every node must take
// a snapshot at a clock >= this one).
func (s *Sequencer) Rebase(clock uint64) {
	s.batches, s.bytes, s.open, s.midway = nil, 0, 0, false
	s.seen = max(s.seen, clock)
}

// DropQuanta forgets the quanta held: the stream they came from broke, and a new one starts
// with a reinitializing quantum. Changes go on by the map of the quanta released.
func (s *Sequencer) DropQuanta() { s.quanta = nil }

// Event is what Next releases: a quantum or a batch of changes.
type Event struct {
	Quantum *quantum.Quantum
	Batch   *source.Batch
}

// Next releases the next event, if one may go: a change up to the next quantum's clock
// first; then that quantum, once every change up to its clock has gone; then any later
// change, once a quantum has gone.
func (s *Sequencer) Next() (Event, bool) {
	head := len(s.quanta) > 0
	switch {
	case len(s.batches) > 0 && (s.mapped || head && s.batches[0].Clock <= s.quanta[0].Clock):
		if head && !s.midway && s.seen >= s.quanta[0].Clock && s.batches[0].Clock > s.quanta[0].Clock {
			break // the quantum goes first: its cut is then its own clock
		}
		b := s.batches[0]
		s.batches[0] = source.Batch{}
		s.batches = s.batches[1:]
		s.bytes -= batchBytes(b)
		s.midway = b.More
		return Event{Batch: &b}, true
	case !head || s.seen < s.quanta[0].Clock || s.midway:
		return Event{}, false
	}
	// Every change up to the quantum's clock has been added and released.
	q := s.quanta[0]
	s.quanta[0] = quantum.Quantum{}
	s.quanta = s.quanta[1:]
	s.mapped = true
	return Event{Quantum: &q}, true
}

// Waiting returns the clock the source must be known to have reached before the next
// quantum can go, if a quantum waits for that.
func (s *Sequencer) Waiting() (uint64, bool) {
	if len(s.quanta) > 0 && s.seen < s.quanta[0].Clock {
		return s.quanta[0].Clock, true
	}
	return 0, false
}

// Settled returns the clock up to which every change and every quantum has been released,
// when Next has nothing more to release: the changes up to Seen have gone, and every quantum
// held is later. ok is false while a change waits (before the first quantum).
func (s *Sequencer) Settled() (uint64, bool) {
	if len(s.batches) > 0 || s.midway || len(s.quanta) > 0 && s.quanta[0].Clock <= s.seen {
		return 0, false
	}
	return s.seen, true
}

// Seen returns the clock up to which the source has delivered everything.
func (s *Sequencer) Seen() uint64 { return s.seen }

// Held returns the number of quanta and the bytes of changes held. Changes are held only
// until the first quantum, and between a call of AddBatch and the Next that releases them.
func (s *Sequencer) Held() (quanta, bytes int) { return len(s.quanta), s.bytes }

// batchBytes approximates the memory a batch holds.
func batchBytes(b source.Batch) int {
	n := 64
	for _, c := range b.Changes {
		n += 96 + len(c.Key) + len(c.Fragment) + len(c.Value)
	}
	return n
}
