package memsource_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/memsource"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deadline bounds every wait for a watch.
const deadline = 10 * time.Second

// recv returns the next batch of a watch, failing if the watch closes or sends nothing
// within the deadline.
func recv(t *testing.T, ch <-chan source.Batch) source.Batch {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	select {
	case b, ok := <-ch:
		require.True(t, ok, "the watch closed")
		return b
	case <-timer.C:
		require.FailNow(t, "no batch within the deadline")
	}
	return source.Batch{}
}

// waitClosed drains a watch until it closes, failing if it does not close within the
// deadline. It returns what it drained.
func waitClosed(t *testing.T, ch <-chan source.Batch) []source.Batch {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	var got []source.Batch
	for {
		select {
		case b, ok := <-ch:
			if !ok {
				return got
			}
			got = append(got, b)
		case <-timer.C:
			require.FailNow(t, "the watch did not close within the deadline")
		}
	}
}

// progressMark asks the source for progress until the watch sends a batch, and returns that
// batch. A watch may miss a request (the contract lets a source answer late or not at all),
// so it asks again every few milliseconds, up to the deadline.
func progressMark(t *testing.T, s *memsource.Source, ch <-chan source.Batch) source.Batch {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	require.NoError(t, s.Progress(t.Context()))
	for {
		select {
		case b, ok := <-ch:
			require.True(t, ok, "the watch closed")
			return b
		case <-tick.C:
			require.NoError(t, s.Progress(t.Context()))
		case <-timer.C:
			require.FailNow(t, "no progress mark within the deadline")
		}
	}
}

func clock(t *testing.T, s *memsource.Source) uint64 {
	t.Helper()
	c, err := s.Clock(t.Context())
	require.NoError(t, err)
	return c
}

func scan(t *testing.T, s *memsource.Source, r keyspace.Range, at uint64) []source.Item {
	t.Helper()
	var out []source.Item
	got, err := s.Scan(t.Context(), r, at, func(it source.Item) error {
		out = append(out, it)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, at, got, "a scan of the past is positioned at the clock asked")
	return out
}

func change(clock uint64, key, frag string, value []byte, del bool) source.Change {
	k := []byte(key)
	return source.Change{Clock: clock, Hash: keyspace.Hash(k), Key: k, Fragment: frag, Value: value, Delete: del}
}

func TestWritesAdvanceTheClock(t *testing.T) {
	s := memsource.New()
	assert.Equal(t, uint64(0), clock(t, s), "a new source is at clock 0")
	steps := []struct {
		name  string
		write func() uint64
	}{
		{"put", func() uint64 { return s.Put([]byte("k"), []byte("v")) }},
		{"put fragment", func() uint64 { return s.PutFragment([]byte("k"), "f", []byte("x")) }},
		{"delete fragment", func() uint64 { return s.DeleteFragment([]byte("k"), "f") }},
		{"delete", func() uint64 { return s.Delete([]byte("k")) }},
		{"delete of an absent item", func() uint64 { return s.Delete([]byte("absent")) }},
		{"put again", func() uint64 { return s.Put([]byte("k"), nil) }},
	}
	for i, st := range steps {
		want := uint64(i + 1)
		assert.Equal(t, want, st.write(), "%s returns its change's clock", st.name)
		assert.Equal(t, want, clock(t, s), "the clock after %s", st.name)
	}
}

// sortItems sorts items as Scan returns them: by hash, then key.
func sortItems(items []source.Item) []source.Item {
	slices.SortFunc(items, func(a, b source.Item) int {
		if a.Hash != b.Hash {
			if a.Hash < b.Hash {
				return -1
			}
			return 1
		}
		return bytes.Compare(a.Key, b.Key)
	})
	return items
}

func TestScanAsOfEveryClock(t *testing.T) {
	s := memsource.New()
	k1, k2 := []byte("k1"), []byte("k2")
	item := func(key []byte, exists bool, value string, frags ...source.Fragment) source.Item {
		it := source.Item{Key: key, Hash: keyspace.Hash(key), Exists: exists, Fragments: frags}
		if exists {
			it.Value = []byte(value)
		}
		return it
	}
	frag := func(id, v string) source.Fragment { return source.Fragment{ID: id, Value: []byte(v)} }

	// Each step writes one change; want is the whole source right after it.
	steps := []struct {
		write func() uint64
		want  []source.Item
	}{
		{func() uint64 { return s.Put(k1, []byte("a")) },
			[]source.Item{item(k1, true, "a")}},
		{func() uint64 { return s.PutFragment(k1, "f2", []byte("x")) },
			[]source.Item{item(k1, true, "a", frag("f2", "x"))}},
		{func() uint64 { return s.PutFragment(k1, "f1", []byte("y")) },
			[]source.Item{item(k1, true, "a", frag("f1", "y"), frag("f2", "x"))}},
		{func() uint64 { return s.PutFragment(k2, "g", []byte("z")) },
			[]source.Item{item(k1, true, "a", frag("f1", "y"), frag("f2", "x")), item(k2, false, "", frag("g", "z"))}},
		{func() uint64 { return s.Put(k1, []byte("b")) },
			[]source.Item{item(k1, true, "b", frag("f1", "y"), frag("f2", "x")), item(k2, false, "", frag("g", "z"))}},
		{func() uint64 { return s.DeleteFragment(k1, "f2") },
			[]source.Item{item(k1, true, "b", frag("f1", "y")), item(k2, false, "", frag("g", "z"))}},
		// An item without value or fragments is gone.
		{func() uint64 { return s.DeleteFragment(k2, "g") },
			[]source.Item{item(k1, true, "b", frag("f1", "y"))}},
		// Deleting an item deletes its fragments.
		{func() uint64 { return s.Delete(k1) },
			nil},
		// and they do not come back with a new fragment.
		{func() uint64 { return s.PutFragment(k1, "f3", []byte("w")) },
			[]source.Item{item(k1, false, "", frag("f3", "w"))}},
		{func() uint64 { return s.Put(k2, []byte("c")) },
			[]source.Item{item(k1, false, "", frag("f3", "w")), item(k2, true, "c")}},
		// Deleting a fragment that is not there changes nothing.
		{func() uint64 { return s.DeleteFragment(k2, "nope") },
			[]source.Item{item(k1, false, "", frag("f3", "w")), item(k2, true, "c")}},
	}
	want := [][]source.Item{nil} // by clock; nothing at clock 0
	for i, st := range steps {
		require.Equal(t, uint64(i+1), st.write())
		want = append(want, sortItems(st.want))
	}
	// Every version stays readable: scan as of every clock, after all the writes.
	for at, w := range want {
		assert.Equal(t, w, scan(t, s, keyspace.Full(), uint64(at)), "as of clock %d", at)
		items, err := s.Items(keyspace.Full(), uint64(at))
		require.NoError(t, err)
		assert.Equal(t, w, items, "Items as of clock %d", at)
	}
}

func TestScanOnlyTheRange(t *testing.T) {
	s := memsource.New()
	const n = 200
	keys := make([][]byte, n)
	for i := range n {
		keys[i] = fmt.Appendf(nil, "key-%03d", i)
		s.Put(keys[i], []byte{byte(i)})
	}
	h := keyspace.Hash(keys[17])
	ranges := append(keyspace.Equal(4),
		keyspace.Full(),
		keyspace.Range{Start: h, End: keyspace.At(h + 1)},           // exactly one key
		keyspace.Range{Start: h + 1, End: keyspace.End},             // up to the end of the space
		keyspace.Range{Start: 0, End: keyspace.At(h)},               // up to, not including, h
		keyspace.Range{Start: 1 << 40, End: keyspace.At(1<<40 + 1)}, // (almost surely) no key
	)
	for _, at := range []uint64{n, n / 2} {
		total := 0
		for i, r := range ranges {
			var want []uint64
			for _, k := range keys[:at] {
				if r.Contains(keyspace.Hash(k)) {
					want = append(want, keyspace.Hash(k))
				}
			}
			slices.Sort(want)
			var got []uint64
			for _, it := range scan(t, s, r, at) {
				require.True(t, r.Contains(it.Hash), "item %q, hash %x, outside %s", it.Key, it.Hash, r)
				require.Equal(t, keyspace.Hash(it.Key), it.Hash, "item %q", it.Key)
				got = append(got, it.Hash)
			}
			assert.Equal(t, want, got, "range %s at %d: every item in it, in hash order", r, at)
			if i < 4 {
				total += len(got)
			}
		}
		assert.Equal(t, int(at), total, "the four quarters hold every item as of %d", at)
	}
	one := scan(t, s, keyspace.Range{Start: h, End: keyspace.At(h + 1)}, n)
	require.Len(t, one, 1)
	assert.Equal(t, keys[17], one[0].Key)
	assert.Equal(t, []byte{17}, one[0].Value)
	assert.Empty(t, scan(t, s, keyspace.Range{Start: h, End: keyspace.At(h + 1)}, 17), "key 17 is written at clock 18")
}

func TestScanErrors(t *testing.T) {
	s := memsource.New()
	s.Put([]byte("a"), []byte("1"))
	s.Put([]byte("b"), []byte("2"))

	_, err := s.Scan(t.Context(), keyspace.Full(), 3, func(source.Item) error { return nil })
	require.Error(t, err, "scanning past the clock")
	assert.NotErrorIs(t, err, source.ErrCompacted)

	boom := errors.New("boom")
	calls := 0
	_, err = s.Scan(t.Context(), keyspace.Full(), 2, func(source.Item) error { calls++; return boom })
	require.ErrorIs(t, err, boom)
	assert.Equal(t, 1, calls, "the scan stops at fn's first error")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = s.Scan(ctx, keyspace.Full(), 2, func(source.Item) error { return nil })
	assert.ErrorIs(t, err, context.Canceled)
}

func TestWritesCopyTheirArguments(t *testing.T) {
	s := memsource.New()
	key, value := []byte("key"), []byte("value")
	s.Put(key, value)
	s.PutFragment(key, "f", value)
	key[0], value[0] = 'X', 'X'
	items := scan(t, s, keyspace.Full(), 2)
	require.Len(t, items, 1)
	assert.Equal(t, []byte("key"), items[0].Key)
	assert.Equal(t, []byte("value"), items[0].Value)
	assert.Equal(t, []source.Fragment{{ID: "f", Value: []byte("value")}}, items[0].Fragments)
}

func TestWatchReplaysThenFollows(t *testing.T) {
	s := memsource.New()
	s.Put([]byte("a"), []byte("1"))
	s.PutFragment([]byte("a"), "f", []byte("x"))
	s.DeleteFragment([]byte("a"), "f")
	s.Delete([]byte("a"))

	w := s.Watch(t.Context(), 1)
	for _, want := range []source.Change{
		change(2, "a", "f", []byte("x"), false),
		change(3, "a", "f", nil, true),
		change(4, "a", "", nil, true),
	} {
		assert.Equal(t, source.Batch{Clock: want.Clock, Changes: []source.Change{want}}, recv(t, w))
	}
	// Then the changes written while watching.
	require.Equal(t, uint64(5), s.Put([]byte("b"), []byte("2")))
	assert.Equal(t, source.Batch{Clock: 5, Changes: []source.Change{change(5, "b", "", []byte("2"), false)}}, recv(t, w))
	require.Equal(t, uint64(6), s.PutFragment([]byte("b"), "g", []byte("y")))
	assert.Equal(t, source.Batch{Clock: 6, Changes: []source.Change{change(6, "b", "g", []byte("y"), false)}}, recv(t, w))

	// A watch from 0 replays everything, from clock 1.
	all := s.Watch(t.Context(), 0)
	for c := uint64(1); c <= 6; c++ {
		b := recv(t, all)
		require.Equal(t, c, b.Clock)
		require.Len(t, b.Changes, 1)
		assert.Equal(t, c, b.Changes[0].Clock)
	}
}

func TestWatchFromTheCurrentClockWaits(t *testing.T) {
	s := memsource.New()
	s.Put([]byte("a"), []byte("1"))
	s.Put([]byte("b"), []byte("2"))
	w := s.Watch(t.Context(), 2)
	// Nothing comes before the progress mark: the watch has nothing to deliver.
	assert.Equal(t, source.Batch{Clock: 2}, progressMark(t, s, w))
	s.Put([]byte("c"), []byte("3"))
	assert.Equal(t, source.Batch{Clock: 3, Changes: []source.Change{change(3, "c", "", []byte("3"), false)}}, recv(t, w))
}

func TestWatchConcurrentWriters(t *testing.T) {
	s := memsource.New()
	watches := []<-chan source.Batch{s.Watch(t.Context(), 0), s.Watch(t.Context(), 0)}
	const writers, each = 4, 50
	var wg sync.WaitGroup
	want := map[string]bool{}
	for w := range writers {
		for i := range each {
			want[fmt.Sprintf("w%d-%d", w, i)] = true
		}
		wg.Go(func() {
			for i := range each {
				s.Put(fmt.Appendf(nil, "w%d-%d", w, i), nil)
			}
		})
	}
	// A watch started after some writes still sees them all.
	watches = append(watches, s.Watch(t.Context(), 0))
	for n, w := range watches {
		got := map[string]bool{}
		for c := uint64(1); c <= writers*each; c++ {
			b := recv(t, w)
			require.Equal(t, c, b.Clock, "watch %d: clocks in order, none skipped", n)
			require.Len(t, b.Changes, 1)
			assert.Equal(t, c, b.Changes[0].Clock)
			got[string(b.Changes[0].Key)] = true
		}
		assert.Equal(t, want, got, "watch %d sees every change", n)
	}
	wg.Wait()
	assert.Equal(t, uint64(writers*each), clock(t, s))
}

func TestWatchStopsWhenCtxEnds(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := memsource.New()
	s.Put([]byte("a"), []byte("1"))

	t.Run("waiting for changes", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		w := s.Watch(ctx, 0)
		assert.Equal(t, uint64(1), recv(t, w).Clock)
		cancel()
		assert.Empty(t, waitClosed(t, w), "nothing after the cancel")
	})
	t.Run("with a batch nobody reads", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		w := s.Watch(ctx, 0)
		cancel()
		// The pending batch may or may not win the race with the cancel; nothing else comes.
		got := waitClosed(t, w)
		assert.LessOrEqual(t, len(got), 1)
	})
	t.Run("already cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		waitClosed(t, s.Watch(ctx, 1))
	})
}

func TestProgress(t *testing.T) {
	t.Run("after the changes", func(t *testing.T) {
		s := memsource.New()
		for i := range 3 {
			s.Put(fmt.Appendf(nil, "k%d", i), nil)
		}
		w := s.Watch(t.Context(), 0)
		require.NoError(t, s.Progress(t.Context()))
		// The mark comes in order with the changes: never before changes it claims delivered.
		for c := uint64(1); c <= 3; c++ {
			b := recv(t, w)
			assert.Equal(t, c, b.Clock)
			assert.Len(t, b.Changes, 1)
		}
		assert.Equal(t, source.Batch{Clock: 3}, progressMark(t, s, w))
	})
	t.Run("every watch", func(t *testing.T) {
		s := memsource.New()
		s.Put([]byte("a"), nil)
		s.Put([]byte("b"), nil)
		w1, w2 := s.Watch(t.Context(), 0), s.Watch(t.Context(), 1)
		assert.Equal(t, uint64(1), recv(t, w1).Clock)
		assert.Equal(t, uint64(2), recv(t, w1).Clock)
		assert.Equal(t, uint64(2), recv(t, w2).Clock)
		assert.Equal(t, source.Batch{Clock: 2}, progressMark(t, s, w1))
		assert.Equal(t, source.Batch{Clock: 2}, progressMark(t, s, w2))
		// Changes still flow after a mark. Asking w2 for progress may have made w1 send
		// another mark, which must not claim more than it delivered.
		s.Put([]byte("c"), nil)
		for _, w := range []<-chan source.Batch{w1, w2} {
			b := recv(t, w)
			for len(b.Changes) == 0 {
				require.Equal(t, source.Batch{Clock: 2}, b)
				b = recv(t, w)
			}
			assert.Equal(t, source.Batch{Clock: 3, Changes: []source.Change{change(3, "c", "", nil, false)}}, b)
		}
	})
	t.Run("without watches", func(t *testing.T) {
		assert.NoError(t, memsource.New().Progress(t.Context()))
	})
}

// fiveKeys is a source with k0 to k4 written, at clocks 1 to 5.
func fiveKeys() *memsource.Source {
	s := memsource.New()
	for i := range 5 {
		s.Put(fmt.Appendf(nil, "k%d", i), nil)
	}
	return s
}

// scanErr is the error of a scan of the whole space at clock at.
func scanErr(t *testing.T, s *memsource.Source, at uint64) error {
	return errOf(s.Scan(t.Context(), keyspace.Full(), at, func(source.Item) error { return nil }))
}

func TestCompact(t *testing.T) {
	t.Run("scan", func(t *testing.T) {
		s := fiveKeys()
		s.Compact(3)
		for at := range uint64(3) {
			assert.ErrorIs(t, scanErr(t, s, at), source.ErrCompacted, "scan at %d", at)
		}
		assert.Len(t, scan(t, s, keyspace.Full(), 3), 3, "the state at the compaction clock stays")
		assert.Len(t, scan(t, s, keyspace.Full(), 5), 5)
		_, err := s.Items(keyspace.Full(), 2)
		assert.ErrorIs(t, err, source.ErrCompacted)

		s.Compact(1) // compaction never goes back
		assert.ErrorIs(t, scanErr(t, s, 2), source.ErrCompacted)

		s.Compact(100) // only up to the clock
		assert.ErrorIs(t, scanErr(t, s, 4), source.ErrCompacted)
		assert.Len(t, scan(t, s, keyspace.Full(), 5), 5)
		// Writes go on after a compaction.
		assert.Equal(t, uint64(6), s.Put([]byte("k5"), nil))
		assert.Len(t, scan(t, s, keyspace.Full(), 6), 6)
	})

	t.Run("watch", func(t *testing.T) {
		s := fiveKeys()
		s.Compact(3)
		for _, from := range []uint64{0, 2} {
			w := s.Watch(t.Context(), from)
			b := recv(t, w)
			assert.ErrorIs(t, b.Err, source.ErrCompacted, "watch from %d", from)
			assert.Empty(t, b.Changes)
			assert.Empty(t, waitClosed(t, w), "the error is the last batch")
		}
		w := s.Watch(t.Context(), 3)
		assert.Equal(t, uint64(4), recv(t, w).Clock)
		assert.Equal(t, uint64(5), recv(t, w).Clock)

		s.Compact(100) // clamped to 5: a watch from 5 keeps going
		s.Put([]byte("k5"), nil)
		b := recv(t, w)
		assert.Equal(t, uint64(6), b.Clock)
		assert.NoError(t, b.Err)
		w = s.Watch(t.Context(), 4)
		assert.ErrorIs(t, recv(t, w).Err, source.ErrCompacted)
		waitClosed(t, w)
	})

	t.Run("watch overtaken", func(t *testing.T) {
		s := fiveKeys()
		w := s.Watch(t.Context(), 0)
		assert.Equal(t, uint64(1), recv(t, w).Clock)
		s.Compact(4)
		// The watch may have prepared its next batch before the compaction; after that it
		// fails rather than skip changes it can no longer deliver.
		var clocks []uint64
		for {
			b := recv(t, w)
			if b.Err != nil {
				assert.ErrorIs(t, b.Err, source.ErrCompacted)
				break
			}
			clocks = append(clocks, b.Clock)
		}
		assert.LessOrEqual(t, len(clocks), 1)
		if len(clocks) == 1 {
			assert.Equal(t, uint64(2), clocks[0])
		}
		assert.Empty(t, waitClosed(t, w))
	})
}

// errOf returns the error of a Scan, whose clock the test does not look at.
func errOf(_ uint64, err error) error { return err }
