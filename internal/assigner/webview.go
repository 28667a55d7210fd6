package assigner

import (
	"context"
	"time"

	"github.com/sliceplane/sliceplane/internal/heatmap"
)

// The web view's history (package webview) is persisted in chunks (heatmap.ChunkColumns
// columns each) under the store's prefix: the leader rewrites the chunks it added to every
// Config.HistoryFlush, and a new leader restores them before its first step, within
// historyRestoreTimeout (the history is for people to look at: a leader that cannot read it in
// time starts a new one rather than wait). A failover loses at most the columns of the last
// HistoryFlush.
const historyRestoreTimeout = 2 * time.Second

// restoreHistory empties the web view and fills it from the persisted chunks.
func (s *served) restoreHistory(ctx context.Context, l *leadership) {
	s.view.Reset()
	ctx, cancel := context.WithTimeout(ctx, historyRestoreTimeout)
	defer cancel()
	start := time.Now()
	chunks, err := s.store.LoadHistory(ctx)
	if err != nil {
		l.log.Warn("could not read the web view's history; it starts anew", "err", err)
		return
	}
	for _, data := range chunks {
		if err := s.view.Restore(data); err != nil {
			l.log.Warn("skipped a chunk of the web view's history", "err", err)
		}
	}
	b := s.view.Bounds()
	l.historyFlushed = b.Last
	l.log.Debug("restored the web view's history", "chunks", len(chunks), "columns", b.Columns, "took", time.Since(start))
}

// recordHistory adds a column of the map as it is to the web view, and persists what was
// added since the last flush once Config.HistoryFlush has passed, in the background.
func (s *served) recordHistory(ctx context.Context, l *leadership, now time.Time) {
	a, loads := l.core.Loads()
	if a == nil {
		return
	}
	s.view.Record(now, a, loads)
	if now.Sub(l.historyAt) < s.cfg.HistoryFlush || !l.flushing.CompareAndSwap(false, true) {
		return
	}
	l.historyAt = now
	b := s.view.Bounds()
	from := l.historyFlushed + 1
	l.background.Go(func() {
		defer l.flushing.Store(false)
		if err := s.flushHistory(ctx, l, from, b); err != nil {
			if ctx.Err() == nil {
				l.log.Warn("could not persist the web view's history; the next flush tries again", "err", err)
			}
			return
		}
		l.historyFlushed = b.Last
	})
}

// flushHistory writes the chunks that hold columns from..b.Last, and deletes those older
// than the ring's oldest column.
func (s *served) flushHistory(ctx context.Context, l *leadership, from uint64, b heatmap.Bounds) error {
	if b.Last < from || b.Columns == 0 {
		return nil
	}
	for k := heatmap.ChunkOf(max(from, b.First)); k <= heatmap.ChunkOf(b.Last); k++ {
		data, err := s.view.Encode(k)
		if err != nil {
			return err
		}
		if err := s.store.PutHistory(ctx, l.fence, k, data); err != nil {
			return err
		}
	}
	return s.store.DeleteHistory(ctx, l.fence, heatmap.ChunkOf(b.First))
}
