package quantum

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t testing.TB) *assignment.Assignment {
	t.Helper()
	a, err := assignment.Uniform(4, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	return a
}

// publish appends a quantum moving slice 0 to node, or a clock-only one when node is "".
func publish(t testing.TB, h *Hub, node string, clock uint64) {
	t.Helper()
	a, pos, _ := h.Current()
	q := Quantum{Position: Position{Term: pos.Term, Seq: pos.Seq + 1}, Clock: clock, Cause: "test"}
	next := a
	if node != "" {
		q.Ops = []assignment.Op{assignment.Assign{Slice: 0, Replicas: []assignment.NodeID{assignment.NodeID(node)}}}
		var err error
		next, err = a.Apply(q.Ops)
		require.NoError(t, err)
	}
	q.Generation = next.Generation()
	require.NoError(t, h.Publish(q, next))
}

func next(t *testing.T, s *Subscription) Quantum {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q, err := s.Next(ctx)
	require.NoError(t, err)
	return q
}

func TestSubscribersResumeOrStartOver(t *testing.T) {
	h := NewHub(HubConfig{}, 7, start(t), 100)
	fresh := h.Subscribe(nil, true)
	q := next(t, fresh)
	assert.True(t, q.Reinitializing())
	assert.Equal(t, Position{Term: 7, Seq: 0}, q.Position)
	assert.Equal(t, uint64(100), q.Clock)

	publish(t, h, "b", 101)
	publish(t, h, "", 105)
	publish(t, h, "c", 106)

	got := next(t, fresh)
	assert.Equal(t, Position{Term: 7, Seq: 1}, got.Position)
	assert.Len(t, got.Ops, 1)
	assert.True(t, next(t, fresh).ClockOnly())
	assert.Equal(t, uint64(106), next(t, fresh).Clock)

	// Resuming from a kept position replays what followed it.
	resumed := h.Subscribe(&Position{Term: 7, Seq: 1}, true)
	assert.Equal(t, uint64(2), next(t, resumed).Seq)
	// Without clock quanta, the clock-only one is skipped.
	routers := h.Subscribe(&Position{Term: 7, Seq: 1}, false)
	assert.Equal(t, uint64(3), next(t, routers).Seq)

	// Another term, a position from the future: start over from the whole map.
	for _, from := range []Position{{Term: 6, Seq: 3}, {Term: 7, Seq: 9}} {
		q := next(t, h.Subscribe(&from, true))
		assert.True(t, q.Reinitializing(), "%v", from)
		assert.Equal(t, Position{Term: 7, Seq: 3}, q.Position)
		a, _, _ := h.Current()
		assert.Same(t, a, q.Snapshot)
	}
}

func TestLaggingSubscriberGetsAReinitInsteadOfAQueue(t *testing.T) {
	h := NewHub(HubConfig{MaxQuanta: 3}, 1, start(t), 0)
	slow := h.Subscribe(&Position{Term: 1}, true)
	for i := range 10 {
		publish(t, h, []string{"a", "b"}[i%2], uint64(i))
	}
	assert.Len(t, h.Recent(100, true), 3, "the hub keeps what it was told to")
	q := next(t, slow)
	assert.True(t, q.Reinitializing(), "the slow watcher fell behind what the hub keeps")
	assert.Equal(t, uint64(10), q.Seq)
	publish(t, h, "c", 20)
	assert.Equal(t, uint64(11), next(t, slow).Seq, "then it follows again")
}

func TestPublishRejectsOutOfOrderQuanta(t *testing.T) {
	a := start(t)
	h := NewHub(HubConfig{}, 2, a, 50)
	assert.Error(t, h.Publish(Quantum{Position: Position{Term: 2, Seq: 2}, Clock: 50}, a), "a gap")
	assert.Error(t, h.Publish(Quantum{Position: Position{Term: 1, Seq: 1}, Clock: 50}, a), "another term")
	assert.Error(t, h.Publish(Quantum{Position: Position{Term: 2, Seq: 1}, Clock: 49}, a), "the clock going back")
	require.NoError(t, h.Publish(Quantum{Position: Position{Term: 2, Seq: 1}, Clock: 50}, a))
}

func TestCloseEndsSubscriptionsAndContextsStopWaiting(t *testing.T) {
	h := NewHub(HubConfig{}, 1, start(t), 0)
	s := h.Subscribe(&Position{Term: 1}, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := s.Next(ctx); done <- err }()
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)

	go func() { _, err := s.Next(context.Background()); done <- err }()
	h.Close()
	assert.ErrorIs(t, <-done, ErrClosed)
	assert.ErrorIs(t, h.Publish(Quantum{Position: Position{Term: 1, Seq: 1}}, start(t)), ErrClosed)
}

func TestManySubscribersSeeEveryQuantumInOrder(t *testing.T) {
	h := NewHub(HubConfig{}, 1, start(t), 0)
	const subscribers, quanta = 20, 200
	var wg sync.WaitGroup
	errs := make(chan string, subscribers)
	for range subscribers {
		s := h.Subscribe(&Position{Term: 1}, true)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for want := uint64(1); want <= quanta; want++ {
				q, err := s.Next(ctx)
				if err != nil || q.Seq != want {
					errs <- fmt.Sprintf("want seq %d, got %d (err %v)", want, q.Seq, err)
					return
				}
			}
		}()
	}
	for i := range quanta {
		publish(t, h, []string{"a", "b", ""}[i%3], uint64(i))
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestSubscribersWaitForTheFirstMap(t *testing.T) {
	h := NewHub(HubConfig{}, 3, nil, 0)
	s := h.Subscribe(nil, true)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Next(done)
	require.ErrorIs(t, err, context.Canceled, "with no map there is nothing to deliver: Next waits")

	a := start(t)
	require.NoError(t, h.Publish(Quantum{Position: Position{Term: 3, Seq: 1}, Snapshot: a, Cause: "initial"}, a))
	q := next(t, s)
	assert.True(t, q.Reinitializing())
	assert.Same(t, a, q.Snapshot)
}

func TestHubKeepsTheDistributorsOfTheLastQuantumThatCarriedThem(t *testing.T) {
	a := start(t)
	h := NewHub(HubConfig{}, 4, a, 10)
	assert.Empty(t, h.Distributors(), "no distributors before a quantum names them")
	q := next(t, h.Subscribe(nil, true))
	require.True(t, q.Reinitializing())
	assert.NotNil(t, q.Distributors, "a reinitializing quantum always carries the set, even empty")
	assert.Empty(t, q.Distributors)

	one := Distributors{"d1": "10.0.0.1:1"}
	require.NoError(t, h.Publish(Quantum{Position: Position{Term: 4, Seq: 1}, Clock: 10, Generation: a.Generation(),
		Snapshot: a, Distributors: one, Cause: "distributors"}, a))
	assert.Equal(t, one, h.Distributors())

	// Quanta without a set leave it as it was.
	publish(t, h, "b", 11)
	publish(t, h, "", 12)
	assert.Equal(t, one, h.Distributors(), "quanta that carry no set keep the last one")
	q = next(t, h.Subscribe(nil, true))
	require.True(t, q.Reinitializing())
	assert.Equal(t, Position{Term: 4, Seq: 3}, q.Position)
	assert.Equal(t, one, q.Distributors, "a fresh subscriber's reinit carries the set")

	two := Distributors{"d1": "10.0.0.1:1", "d2": "10.0.0.2:1"}
	cur, pos, _ := h.Current()
	require.NoError(t, h.Publish(Quantum{Position: Position{Term: 4, Seq: pos.Seq + 1}, Clock: 12, Generation: cur.Generation(),
		Snapshot: cur, Distributors: two, Cause: "distributors"}, cur))
	assert.Equal(t, two, h.Distributors())
	// A subscriber from another term, or too far back, starts over with the set too.
	q = next(t, h.Subscribe(&Position{Term: 3, Seq: 1}, true))
	require.True(t, q.Reinitializing())
	assert.Equal(t, two, q.Distributors)

	// An empty set is a set: every distributor left.
	require.NoError(t, h.Publish(Quantum{Position: Position{Term: 4, Seq: pos.Seq + 2}, Clock: 12, Generation: cur.Generation(),
		Snapshot: cur, Distributors: Distributors{}, Cause: "distributors"}, cur))
	assert.Empty(t, h.Distributors())
	q = next(t, h.Subscribe(nil, true))
	assert.NotNil(t, q.Distributors)
	assert.Empty(t, q.Distributors, "the reinit says no distributor is left")
}

func TestSubscriberInStepSeesTheDistributorsQuantum(t *testing.T) {
	a := start(t)
	h := NewHub(HubConfig{}, 1, a, 0)
	s := h.Subscribe(&Position{Term: 1}, false)
	set := Distributors{"d1": "x:1"}
	require.NoError(t, h.Publish(Quantum{Position: Position{Term: 1, Seq: 1}, Generation: a.Generation(),
		Snapshot: a, Distributors: set, Cause: "distributors"}, a))
	q := next(t, s)
	assert.Equal(t, uint64(1), q.Seq)
	assert.True(t, q.Reinitializing())
	assert.Equal(t, set, q.Distributors)
}

func TestRecentListsClockOnlyQuantaMadeBySomeone(t *testing.T) {
	h := NewHub(HubConfig{}, 1, start(t), 0)
	publish(t, h, "b", 1)
	publish(t, h, "", 2) // a tick of the clock
	a, pos, _ := h.Current()
	audit := Quantum{Position: Position{Term: 1, Seq: pos.Seq + 1}, Clock: 2, Generation: a.Generation(),
		Cause: "admin: freeze balancing", By: "spiffe://sliceplane/admin/alice"}
	require.NoError(t, h.Publish(audit, a))

	var seqs []uint64
	for _, q := range h.Recent(100, false) {
		seqs = append(seqs, q.Seq)
	}
	assert.Equal(t, []uint64{1, 3}, seqs, "the freeze is history, the tick is not")
	assert.Len(t, h.Recent(100, true), 3)
}

func TestResetStartsEverySubscriberOverExceptOneAtItsPosition(t *testing.T) {
	a := start(t)
	h := NewHub(HubConfig{Follows: true}, 4, nil, 0)
	require.NoError(t, h.Reset(Quantum{Position: Position{Term: 4, Seq: 7}, Clock: 70, Snapshot: a, Cause: "reinit"}))
	behind := h.Subscribe(&Position{Term: 4, Seq: 5}, false)
	at := h.Subscribe(&Position{Term: 4, Seq: 7}, false)
	q := next(t, behind)
	require.True(t, q.Reinitializing(), "the hub holds nothing before its reset")
	assert.Equal(t, Position{Term: 4, Seq: 7}, q.Position)

	publish(t, h, "b", 80)
	b, _, _ := h.Current()
	q = next(t, at)
	assert.False(t, q.Reinitializing(), "a subscriber at the reset's position resumes")
	assert.Equal(t, uint64(8), q.Seq)

	// A new term upstream: the hub starts over, and so does every subscriber.
	require.NoError(t, h.Reset(Quantum{Position: Position{Term: 5, Seq: 2}, Clock: 90, Snapshot: b, Cause: "reinit"}))
	q = next(t, at)
	require.True(t, q.Reinitializing())
	assert.Equal(t, Position{Term: 5, Seq: 2}, q.Position)

	err := h.Reset(Quantum{Position: Position{Term: 4, Seq: 9}, Snapshot: a})
	require.Error(t, err, "an older term's map never replaces a newer one's")
	_, pos, _ := h.Current()
	assert.Equal(t, Position{Term: 5, Seq: 2}, pos, "a refused reset changes nothing")
	require.Error(t, h.Reset(Quantum{Position: Position{Term: 5, Seq: 3}}), "a reset needs a map")
}

func TestAFollowingHubHoldsAWatcherAheadOfItUntilItCatchesUp(t *testing.T) {
	a := start(t)
	h := NewHub(HubConfig{Follows: true}, 4, nil, 0)
	require.NoError(t, h.Reset(Quantum{Position: Position{Term: 4, Seq: 7}, Snapshot: a}))
	ahead := h.Subscribe(&Position{Term: 4, Seq: 8}, true)
	newer := h.Subscribe(&Position{Term: 5, Seq: 1}, true)
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := ahead.Next(expired)
	require.ErrorIs(t, err, context.Canceled, "the watcher has seen 4.8: the hub sends nothing until it has more")
	_, err = newer.Next(expired)
	require.ErrorIs(t, err, context.Canceled, "an older term's map is not sent to a watcher of a newer one")

	publish(t, h, "b", 1)
	publish(t, h, "c", 2)
	q := next(t, ahead)
	assert.Equal(t, Position{Term: 4, Seq: 9}, q.Position, "resumed after what the watcher had")
	require.NoError(t, h.Reset(Quantum{Position: Position{Term: 5, Seq: 1}, Snapshot: a}))
	publish(t, h, "d", 3)
	q = next(t, newer)
	assert.False(t, q.Reinitializing(), "the watcher stood at the position the hub reset to: it resumes")
	assert.Equal(t, Position{Term: 5, Seq: 2}, q.Position)

	origin := NewHub(HubConfig{}, 4, a, 0)
	q = next(t, origin.Subscribe(&Position{Term: 4, Seq: 8}, true))
	assert.True(t, q.Reinitializing(), "the origin never gave out 4.8: the watcher starts over")
}

// A router's subscription skips clock ticks: ticks alone leaving the hub's window do not
// put it behind, where a subscriber that takes them must start over.
func TestClockTicksAloneDoNotPutARouterBehind(t *testing.T) {
	h := NewHub(HubConfig{MaxQuanta: 3}, 1, start(t), 0)
	publish(t, h, "b", 1)
	router := h.Subscribe(&Position{Term: 1, Seq: 1}, false)
	distributor := h.Subscribe(&Position{Term: 1, Seq: 1}, true)
	for i := range 10 {
		publish(t, h, "", uint64(2+i))
	}
	publish(t, h, "c", 20)
	q := next(t, router)
	assert.False(t, q.Reinitializing(), "only ticks left the window after the router's cursor")
	assert.Equal(t, Position{Term: 1, Seq: 12}, q.Position)
	assert.Len(t, q.Ops, 1)
	assert.True(t, next(t, distributor).Reinitializing(), "the ticks it takes left the window")
	resumed := h.Subscribe(&Position{Term: 1, Seq: 1}, false)
	q = next(t, resumed)
	assert.False(t, q.Reinitializing(), "a router resuming past ticks alone is not behind")
	assert.Equal(t, Position{Term: 1, Seq: 12}, q.Position)
	assert.True(t, next(t, h.Subscribe(&Position{Term: 1, Seq: 1}, true)).Reinitializing())

	// A change that left the window still puts a router behind.
	late := h.Subscribe(&Position{Term: 1, Seq: 12}, false)
	publish(t, h, "d", 21)
	for i := range 5 {
		publish(t, h, "", uint64(22+i))
	}
	publish(t, h, "e", 30)
	assert.True(t, next(t, late).Reinitializing())
}

// Clock ticks wake only the subscribers that take them; a change of the map wakes all.
func TestClockTicksWakeOnlyTheSubscribersThatTakeThem(t *testing.T) {
	h := NewHub(HubConfig{}, 1, start(t), 0)
	h.mu.Lock()
	all, maps := h.wake, h.wakeMap
	h.mu.Unlock()
	publish(t, h, "", 1)
	assert.True(t, closed(all), "a tick wakes the subscribers that take ticks")
	assert.False(t, closed(maps), "a tick does not wake the others")
	publish(t, h, "b", 2)
	assert.True(t, closed(maps), "a change wakes them")
	h.mu.Lock()
	maps = h.wakeMap
	h.mu.Unlock()
	h.Close()
	assert.True(t, closed(maps), "so does the hub's close")
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
