package distributor

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

func q(seq, clock uint64) quantum.Quantum {
	return quantum.Quantum{Position: quantum.Position{Term: 1, Seq: seq}, Clock: clock}
}

func batch(clock uint64, keys ...string) source.Batch {
	b := source.Batch{Clock: clock}
	for _, k := range keys {
		b.Changes = append(b.Changes, source.Change{Clock: clock, Key: []byte(k), Value: []byte("value-" + k)})
	}
	return b
}

// drain releases events until Next says none may go.
func drain(s *Sequencer) []Event {
	var out []Event
	for {
		e, ok := s.Next()
		if !ok {
			return out
		}
		out = append(out, e)
	}
}

// describe renders events as "q<seq>" and "b<clock>".
func describe(es []Event) []string {
	out := make([]string, len(es))
	for i, e := range es {
		switch {
		case e.Quantum != nil && e.Batch == nil:
			out[i] = fmt.Sprintf("q%d", e.Quantum.Seq)
		case e.Batch != nil && e.Quantum == nil:
			out[i] = fmt.Sprintf("b%d", e.Batch.Clock)
		default:
			out[i] = fmt.Sprintf("bad event %+v", e)
		}
	}
	return out
}

func TestSequencerOrdersChangesAroundQuanta(t *testing.T) {
	s := NewSequencer(10)
	assert.Equal(t, uint64(10), s.Seen())
	_, ok := s.Next()
	assert.False(t, ok, "nothing held")
	_, waiting := s.Waiting()
	assert.False(t, waiting)

	s.AddBatch(batch(12, "a"))
	assert.Empty(t, drain(s), "a change waits for the first quantum: there is no map to route it by")
	s.AddQuantum(q(1, 11))
	assert.Equal(t, []string{"q1", "b12"}, describe(drain(s)), "the source is past 11: the quantum goes, then the later change")
	s.AddQuantum(q(2, 15))
	clock, waiting := s.Waiting()
	assert.True(t, waiting)
	assert.Equal(t, uint64(15), clock)
	s.AddBatch(batch(14, "b"))
	assert.Equal(t, []string{"b14"}, describe(drain(s)), "the change at 14 precedes the quantum at 15, which waits")
	clock, waiting = s.Waiting()
	assert.True(t, waiting)
	assert.Equal(t, uint64(15), clock)
	s.AddBatch(source.Batch{Clock: 15}) // a progress mark
	_, waiting = s.Waiting()
	assert.False(t, waiting)
	assert.Equal(t, []string{"q2"}, describe(drain(s)))
	n, bytes := s.Held()
	assert.Zero(t, n)
	assert.Zero(t, bytes)
}

// TestSequencerChangesGoOnWithoutQuanta: once a map is known, changes never wait for the
// assigner (which may be failing over); the next quantum is applied at a cut after them.
func TestSequencerChangesGoOnWithoutQuanta(t *testing.T) {
	s := NewSequencer(10)
	s.AddQuantum(q(1, 10))
	assert.Equal(t, []string{"q1"}, describe(drain(s)))
	for c := uint64(11); c <= 13; c++ {
		s.AddBatch(batch(c, "k"))
	}
	assert.Equal(t, []string{"b11", "b12", "b13"}, describe(drain(s)), "no quantum at least as late is known, and none is needed")
	s.AddQuantum(q(2, 12)) // stamped before the changes at 13 reached the leader
	s.AddBatch(batch(14, "k"))
	assert.Equal(t, []string{"q2", "b14"}, describe(drain(s)), "applied at a cut at 13, after what was routed already")
	s.DropQuanta()
	s.AddBatch(batch(15, "k"))
	assert.Equal(t, []string{"b15"}, describe(drain(s)), "a broken quanta stream stops no change")
}

func TestSequencerChangeAtTheQuantumsClockComesFirst(t *testing.T) {
	s := NewSequencer(0)
	s.AddQuantum(q(1, 5))
	s.AddQuantum(q(2, 5))
	s.AddBatch(batch(5, "x"))
	assert.Equal(t, []string{"b5", "q1", "q2"}, describe(drain(s)))
}

func TestSequencerDropsStaleBatches(t *testing.T) {
	s := NewSequencer(10)
	s.AddBatch(batch(10, "old")) // at from: delivered before
	s.AddBatch(batch(3, "older"))
	_, bytes := s.Held()
	assert.Zero(t, bytes)
	s.AddBatch(batch(12, "new"))
	s.AddBatch(source.Batch{Clock: 12}) // a repeated mark
	s.AddBatch(batch(11, "late"))       // behind what was seen
	assert.Equal(t, uint64(12), s.Seen())
	s.AddQuantum(q(1, 20))
	s.AddBatch(source.Batch{Clock: 20})
	assert.Equal(t, []string{"b12", "q1"}, describe(drain(s)))
}

func TestSequencerHeldCountsBytes(t *testing.T) {
	s := NewSequencer(0)
	s.AddQuantum(q(1, 100))
	n, bytes := s.Held()
	assert.Equal(t, 1, n)
	assert.Zero(t, bytes)
	s.AddBatch(batch(1, "k1"))
	_, one := s.Held()
	assert.Positive(t, one)
	s.AddBatch(source.Batch{Clock: 2}) // marks hold nothing
	_, same := s.Held()
	assert.Equal(t, one, same)
	big := batch(3, "k2")
	big.Changes[0].Value = make([]byte, 10000)
	s.AddBatch(big)
	_, more := s.Held()
	assert.GreaterOrEqual(t, more-one, 10000, "the value's bytes count")
	assert.Equal(t, batchBytes(batch(1, "k1"))+batchBytes(big), more)

	s.AddBatch(source.Batch{Clock: 100})
	assert.Equal(t, []string{"b1", "b3", "q1"}, describe(drain(s)))
	n, bytes = s.Held()
	assert.Zero(t, n)
	assert.Zero(t, bytes)
}

func TestSequencerDropQuanta(t *testing.T) {
	s := NewSequencer(0)
	s.AddQuantum(q(1, 10))
	s.AddQuantum(q(2, 20))
	s.AddBatch(batch(5, "a"))
	s.AddBatch(batch(15, "b"))
	s.DropQuanta()
	n, bytes := s.Held()
	assert.Zero(t, n, "the quanta are gone")
	assert.Equal(t, batchBytes(batch(5, "a"))+batchBytes(batch(15, "b")), bytes, "the changes stay")
	_, waiting := s.Waiting()
	assert.False(t, waiting, "no quantum waits")
	assert.Empty(t, drain(s), "no quantum was ever released: the changes wait for a map")
	assert.Equal(t, uint64(15), s.Seen(), "what the source delivered stays delivered")

	// The new stream starts with a reinitializing quantum.
	s.AddQuantum(quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 4}, Clock: 18, Cause: "reinit"})
	clock, waiting := s.Waiting()
	assert.True(t, waiting)
	assert.Equal(t, uint64(18), clock)
	s.AddBatch(source.Batch{Clock: 18})
	es := drain(s)
	require.Len(t, es, 3, "%v", describe(es))
	assert.Equal(t, []string{"b5", "b15", "q4"}, describe(es))
	assert.Equal(t, uint64(2), es[2].Quantum.Term, "the new stream's quantum, not a dropped one")
	n, bytes = s.Held()
	assert.Zero(t, n)
	assert.Zero(t, bytes)
}

func TestSequencerRebase(t *testing.T) {
	s := NewSequencer(0)
	s.AddQuantum(q(1, 30))
	s.AddBatch(batch(5, "a"))
	s.AddBatch(batch(8, "b"))
	s.Rebase(25)
	n, bytes := s.Held()
	assert.Equal(t, 1, n, "the quanta stay")
	assert.Zero(t, bytes, "the changes are forgotten")
	assert.Equal(t, uint64(25), s.Seen())
	clock, waiting := s.Waiting()
	assert.True(t, waiting)
	assert.Equal(t, uint64(30), clock)
	s.AddBatch(batch(20, "before the rebase")) // at or below the new base: dropped
	_, bytes = s.Held()
	assert.Zero(t, bytes)
	s.AddBatch(batch(27, "c"))
	s.AddBatch(source.Batch{Clock: 30})
	assert.Equal(t, []string{"b27", "q1"}, describe(drain(s)))

	// Rebasing below what was seen keeps what was seen.
	s.Rebase(10)
	assert.Equal(t, uint64(30), s.Seen())
	s.AddQuantum(q(2, 30))
	assert.Equal(t, []string{"q2"}, describe(drain(s)), "the source is still known to be at 30")
}

// TestSequencerCausalOrderProperty adds quanta (nondecreasing clocks) and batches
// (increasing clocks, some of them progress marks) in a random interleaving, draining at
// random points, then a final progress mark; every quantum and every non-empty batch must be
// released once, in causal order, and nothing may wait that need not.
func TestSequencerCausalOrderProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		from := rapid.Uint64Range(0, 50).Draw(t, "from")
		batches, clock := drawBatches(t, from)
		quanta := drawQuanta(t, from, clock)
		final := quanta[len(quanta)-1].Clock

		m := &sequencerModel{t: t, s: NewSequencer(from), quanta: quanta, seen: from}
		for step, bi := 0, 0; m.qi < len(quanta) || bi < len(batches); step++ {
			when := fmt.Sprintf("step %d", step)
			switch rapid.IntRange(0, 4).Draw(t, "action") {
			case 0, 1:
				if m.qi < len(quanta) {
					m.s.AddQuantum(quanta[m.qi])
					m.qi++
				}
			case 2, 3:
				if bi < len(batches) {
					m.addBatch(batches[bi])
					bi++
				}
			case 4:
				if rapid.Bool().Draw(t, "drain all") {
					for m.next(when) {
					}
				} else {
					m.next(when)
				}
			}
			if rapid.IntRange(0, 9).Draw(t, "repeat a stale mark") == 0 && m.seen > 0 {
				m.addBatch(source.Batch{Clock: rapid.Uint64Range(0, m.seen).Draw(t, "stale clock")})
			}
			m.check(when)
		}
		m.addBatch(source.Batch{Clock: final}) // the final progress mark
		for m.next("final drain") {
		}

		// Everything was released, exactly once.
		if hq, hb := m.s.Held(); hq != 0 || hb != 0 {
			t.Fatalf("held after draining: %d quanta, %d bytes", hq, hb)
		}
		if _, waiting := m.s.Waiting(); waiting {
			t.Fatal("waiting after draining")
		}
		checkCausalRelease(t, batches, quanta, m.out)
	})
}

// drawBatches draws batches at increasing clocks after from, some of them empty (progress
// marks), and returns them with the last clock.
func drawBatches(t *rapid.T, from uint64) ([]source.Batch, uint64) {
	var batches []source.Batch
	clock := from
	for i := range rapid.IntRange(0, 25).Draw(t, "batches") {
		clock += rapid.Uint64Range(1, 4).Draw(t, fmt.Sprintf("batch %d step", i))
		b := source.Batch{Clock: clock}
		for j := range rapid.IntRange(0, 3).Draw(t, fmt.Sprintf("batch %d changes", i)) {
			b.Changes = append(b.Changes, source.Change{Clock: clock, Key: fmt.Appendf(nil, "k%d.%d", i, j),
				Value: make([]byte, rapid.IntRange(0, 64).Draw(t, fmt.Sprintf("batch %d change %d size", i, j)))})
		}
		batches = append(batches, b)
	}
	return batches, clock
}

// drawQuanta draws quanta at nondecreasing clocks, ending with one at the highest clock (of
// quanta and of batches up to clock), so that every change has one to precede.
func drawQuanta(t *rapid.T, from, clock uint64) []quantum.Quantum {
	var quanta []quantum.Quantum
	qc := rapid.Uint64Range(0, from+5).Draw(t, "first quantum clock")
	for i := range rapid.IntRange(0, 15).Draw(t, "quanta") {
		qc += rapid.Uint64Range(0, 6).Draw(t, fmt.Sprintf("quantum %d step", i))
		quanta = append(quanta, q(uint64(i+1), qc))
	}
	return append(quanta, q(uint64(len(quanta)+1), max(clock, qc)))
}

// sequencerModel follows what a Sequencer must hold and release, and checks it against one.
type sequencerModel struct {
	t      *rapid.T
	s      *Sequencer
	quanta []quantum.Quantum
	out    []Event

	qi        int            // next quantum to add
	releasedQ int            // quanta released so far
	seen      uint64         // the model's seen
	held      []source.Batch // the model's held batches
}

// check compares Seen, Held and Waiting against the model.
func (m *sequencerModel) check(when string) {
	t, s := m.t, m.s
	if s.Seen() != m.seen {
		t.Fatalf("%s: Seen %d, want %d", when, s.Seen(), m.seen)
	}
	hq, hb := s.Held()
	wantBytes := 0
	for _, b := range m.held {
		wantBytes += batchBytes(b)
	}
	if hq != m.qi-m.releasedQ || hb != wantBytes {
		t.Fatalf("%s: Held %d quanta %d bytes, want %d and %d", when, hq, hb, m.qi-m.releasedQ, wantBytes)
	}
	wc, waiting := s.Waiting()
	wantWaiting := m.releasedQ < m.qi && m.seen < m.quanta[m.releasedQ].Clock
	if waiting != wantWaiting || waiting && wc != m.quanta[m.releasedQ].Clock {
		t.Fatalf("%s: Waiting %d %v; seen %d, head quantum %v", when, wc, waiting, m.seen, m.quanta[m.releasedQ:m.qi])
	}
}

// next releases one event, if the sequencer has one to go, and checks it against the model.
func (m *sequencerModel) next(when string) bool {
	t := m.t
	m.check(when)
	e, ok := m.s.Next()
	if !ok {
		// Nothing may go: then no quantum is releasable, so if one is held it waits
		// for the source.
		if m.releasedQ > 0 && len(m.held) > 0 {
			t.Fatalf("%s: a map is known, yet the change at %d waits", when, m.held[0].Clock)
		}
		if m.releasedQ < m.qi {
			if _, waiting := m.s.Waiting(); !waiting {
				t.Fatalf("%s: a quantum is held, not waiting for the source, yet nothing was released", when)
			}
			if len(m.held) > 0 && m.held[0].Clock <= m.quanta[m.releasedQ].Clock {
				t.Fatalf("%s: the change at %d precedes the head quantum at %d, yet was not released",
					when, m.held[0].Clock, m.quanta[m.releasedQ].Clock)
			}
		}
		return false
	}
	m.out = append(m.out, e)
	switch {
	case e.Quantum != nil && e.Batch == nil:
		m.releasedQ++
	case e.Batch != nil && e.Quantum == nil:
		if len(m.held) == 0 || m.held[0].Clock != e.Batch.Clock {
			t.Fatalf("%s: released batch %d; held %v", when, e.Batch.Clock, m.held)
		}
		m.held = m.held[1:]
	default:
		t.Fatalf("%s: bad event %+v", when, e)
	}
	return true
}

func (m *sequencerModel) addBatch(b source.Batch) {
	m.s.AddBatch(b)
	if b.Clock > m.seen {
		m.seen = b.Clock
		if len(b.Changes) > 0 {
			m.held = append(m.held, b)
		}
	}
}

// checkCausalRelease checks that out holds every quantum and every non-empty batch exactly
// once, quanta in order and each after the changes up to its clock, and no change before the
// first quantum but those up to its clock.
func checkCausalRelease(t *rapid.T, batches []source.Batch, quanta []quantum.Quantum, out []Event) {
	pos := map[string]int{}
	for i, e := range out {
		k := describe([]Event{e})[0]
		if _, dup := pos[k]; dup {
			t.Fatalf("%s released twice: %v", k, describe(out))
		}
		pos[k] = i
	}
	nonEmpty := 0
	for _, b := range batches {
		if len(b.Changes) > 0 {
			nonEmpty++
			if _, ok := pos[fmt.Sprintf("b%d", b.Clock)]; !ok {
				t.Fatalf("batch %d never released: %v", b.Clock, describe(out))
			}
		}
	}
	if len(out) != len(quanta)+nonEmpty {
		t.Fatalf("released %d events, want %d quanta and %d batches: %v", len(out), len(quanta), nonEmpty, describe(out))
	}
	// Quanta in order, each with its own content.
	last := -1
	for _, qu := range quanta {
		i, ok := pos[fmt.Sprintf("q%d", qu.Seq)]
		if !ok || i < last {
			t.Fatalf("quantum %d missing or out of order: %v", qu.Seq, describe(out))
		}
		if out[i].Quantum.Clock != qu.Clock {
			t.Fatalf("quantum %d released with clock %d, added with %d", qu.Seq, out[i].Quantum.Clock, qu.Clock)
		}
		last = i
		// Causality: the changes up to its clock before it, the later ones after.
		for _, b := range batches {
			if len(b.Changes) == 0 {
				continue
			}
			bp := pos[fmt.Sprintf("b%d", b.Clock)]
			if b.Clock <= qu.Clock && bp > i || qu.Seq == quanta[0].Seq && b.Clock > qu.Clock && bp < i {
				t.Fatalf("batch %d and quantum %d (clock %d) out of causal order: %v", b.Clock, qu.Seq, qu.Clock, describe(out))
			}
		}
	}
	checkBatchOrder(t, batches, out)
}

// checkBatchOrder checks that out releases batches in clock order, with their changes intact.
func checkBatchOrder(t *rapid.T, batches []source.Batch, out []Event) {
	var prev uint64
	for _, e := range out {
		if e.Batch == nil {
			continue
		}
		if e.Batch.Clock <= prev {
			t.Fatalf("batches out of order: %v", describe(out))
		}
		prev = e.Batch.Clock
		for _, b := range batches {
			if b.Clock == e.Batch.Clock && len(b.Changes) != len(e.Batch.Changes) {
				t.Fatalf("batch %d released with %d changes, added with %d", b.Clock, len(e.Batch.Changes), len(b.Changes))
			}
		}
	}
}

// TestSequencerALargeTransactionComesInParts: a transaction in several batches (More) goes
// to the router part by part, and its clock counts as seen only with the last part, so a
// quantum at that clock waits for all of it.
func TestSequencerALargeTransactionComesInParts(t *testing.T) {
	s := NewSequencer(10)
	s.AddQuantum(q(1, 10))
	assert.Equal(t, []string{"q1"}, describe(drain(s)))
	part := batch(12, "a")
	part.More = true
	s.AddBatch(part)
	s.AddQuantum(q(2, 12))
	s.AddBatch(source.Batch{Clock: 11}) // a stale mark, and a mark cannot split a transaction
	assert.Equal(t, uint64(10), s.Seen(), "clock 12 is not whole yet")
	assert.Equal(t, []string{"b12"}, describe(drain(s)), "the first part goes; the quantum at 12 waits for the rest")
	clock, waiting := s.Waiting()
	assert.True(t, waiting)
	assert.Equal(t, uint64(12), clock)
	s.AddBatch(batch(12, "b"))
	assert.Equal(t, uint64(12), s.Seen())
	assert.Equal(t, []string{"b12", "q2"}, describe(drain(s)))
	s.AddBatch(batch(12, "again")) // a whole clock already seen
	assert.Empty(t, drain(s))

	// A quantum stamped before a transaction whose first part went waits for its last part:
	// its cut must not split the transaction.
	part = batch(14, "c")
	part.More = true
	s.AddBatch(part)
	assert.Equal(t, []string{"b14"}, describe(drain(s)))
	s.AddQuantum(q(3, 12))
	assert.Empty(t, drain(s), "midway through the transaction at 14")
	_, ok := s.Settled()
	assert.False(t, ok)
	s.AddBatch(batch(14, "d"))
	assert.Equal(t, []string{"b14", "q3"}, describe(drain(s)))
}

func TestSequencerSettlesOnceNothingUpToSeenWaits(t *testing.T) {
	s := NewSequencer(10)
	s.AddBatch(batch(11, "a"))
	_, ok := s.Settled()
	assert.False(t, ok, "a change waits for the first quantum")
	s.AddQuantum(q(1, 10))
	drain(s)
	clock, ok := s.Settled()
	assert.True(t, ok)
	assert.Equal(t, uint64(11), clock)
	s.AddQuantum(q(2, 20))
	s.AddBatch(source.Batch{Clock: 15})
	clock, ok = s.Settled()
	assert.True(t, ok, "the quantum held is later than what was seen")
	assert.Equal(t, uint64(15), clock)
	s.AddBatch(source.Batch{Clock: 20})
	_, ok = s.Settled()
	assert.False(t, ok, "the quantum at 20 is to go first")
	drain(s)
	clock, ok = s.Settled()
	assert.True(t, ok)
	assert.Equal(t, uint64(20), clock)
}
