package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/sliceplane/sliceplane/internal/source"
)

// maxBatchChanges bounds the changes of one batch: a transaction of more (a COPY of a
// million rows) goes out in several, each but the last marked More.
const maxBatchChanges = 4096

// Watch implements source.Source: the changes committed after from, one batch per
// transaction (or several, for a large one), through the slot; the clock of a change is its
// transaction's commit LSN. While no change comes, the server's progress arrives as
// progress marks: at least every Status while the server answers (a mark that repeats
// the last clock says only that the stream lives), none while it does not. If the slot no longer holds the changes after from (it was dropped,
// recreated or lost its WAL, or it was confirmed past from), the last batch is
// source.ErrCompacted, and the caller starts over from a later clock, after a rescan. A
// source without a Slot cannot Watch (it fails at once): use WatchClock.
func (s *Source) Watch(ctx context.Context, from uint64) <-chan source.Batch {
	return s.run(ctx, func(out chan<- source.Batch) error {
		if s.cfg.Slot == "" {
			return source.MarkMisconfigured(errors.New("postgres: watching the changes needs a replication slot (Config.Slot)"))
		}
		if err := s.ready(ctx); err != nil {
			return err
		}
		return s.watch(ctx, from, out)
	})
}

// WatchClock implements source.ClockWatcher: the WAL insert position, every Status when it
// moved past from. It needs no slot.
func (s *Source) WatchClock(ctx context.Context, from uint64) <-chan source.Batch {
	return s.run(ctx, func(out chan<- source.Batch) error { return s.watchClock(ctx, from, out) })
}

// run runs a watch on its own goroutine, which sends its error, classified, as the last
// batch and closes the channel.
func (s *Source) run(ctx context.Context, watch func(chan<- source.Batch) error) <-chan source.Batch {
	out := make(chan source.Batch)
	go func() {
		defer close(out)
		if err := watch(out); err != nil && ctx.Err() == nil {
			select {
			case out <- source.Batch{Err: classify(err)}:
			case <-ctx.Done():
			}
		}
	}()
	return out
}

// watchClock sends the WAL insert position whenever it moved past from, every Status.
func (s *Source) watchClock(ctx context.Context, from uint64, out chan<- source.Batch) error {
	t := time.NewTicker(s.cfg.Status)
	defer t.Stop()
	for {
		clock, err := s.Clock(ctx)
		if err != nil {
			return err
		}
		if clock > from {
			select {
			case out <- source.Batch{Clock: clock}:
				from = clock
			case <-ctx.Done():
				return nil
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// watch follows the slot from from until ctx ends or the stream fails.
func (s *Source) watch(ctx context.Context, from uint64, out chan<- source.Batch) error {
	rctx, cancel := s.bounded(ctx)
	defer cancel()
	start, err := s.ensureSlot(rctx)
	if err != nil {
		return err
	}
	if start > from {
		return fmt.Errorf("%w: watching from %s, slot %s starts at %s", source.ErrCompacted,
			pglogrepl.LSN(from), s.cfg.Slot, pglogrepl.LSN(start))
	}
	conn, err := s.replicationConn(rctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	opts := pglogrepl.StartReplicationOptions{PluginArgs: []string{"proto_version '1'",
		fmt.Sprintf("publication_names '%s'", s.cfg.Publication)}}
	if s.cols.binary {
		opts.PluginArgs = append(opts.PluginArgs, "binary 'true'")
	}
	if err := pglogrepl.StartReplication(rctx, conn, s.cfg.Slot, pglogrepl.LSN(from), opts); err != nil {
		return slotError(fmt.Errorf("postgres: starting replication from slot %s: %w", s.cfg.Slot, err))
	}
	st := &stream{s: s, conn: conn, out: out, from: from, read: from, relations: map[uint32]*relation{}}
	progress := s.addWatch()
	defer s.dropWatch(progress)
	return st.run(ctx, progress)
}

// replicationConn connects for logical replication.
func (s *Source) replicationConn(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(s.cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres: the DSN: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: connecting for replication: %w", err)
	}
	return conn, nil
}

// ensureSlot creates the slot if it is missing, and drops and recreates one that lost its
// WAL. It returns the position the slot can be read from: its confirmed position, or where
// a new one starts.
func (s *Source) ensureSlot(ctx context.Context) (uint64, error) {
	var confirmed *string
	var status *string
	err := s.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, wal_status FROM pg_replication_slots WHERE slot_name = $1`,
		s.cfg.Slot).Scan(&confirmed, &status)
	switch {
	case err == nil && status != nil && *status == "lost":
		s.logger().Warn("postgres: the replication slot lost its WAL; recreating it", "slot", s.cfg.Slot)
		if _, err := s.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s.cfg.Slot); err != nil {
			return 0, fmt.Errorf("postgres: dropping slot %s: %w", s.cfg.Slot, err)
		}
	case err == nil && confirmed != nil:
		lsn, err := pglogrepl.ParseLSN(*confirmed)
		return uint64(lsn), err
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("postgres: reading slot %s: %w", s.cfg.Slot, err)
	}
	return s.createSlot(ctx)
}

// createSlot creates the slot and returns its consistent point.
func (s *Source) createSlot(ctx context.Context) (uint64, error) {
	conn, err := s.replicationConn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, s.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil && isDuplicate(err) {
		return s.ensureSlot(ctx) // another process made it meanwhile
	}
	if err != nil {
		return 0, fmt.Errorf("postgres: creating slot %s: %w", s.cfg.Slot, err)
	}
	s.logger().Info("postgres: created the replication slot", "slot", s.cfg.Slot, "at", res.ConsistentPoint)
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	return uint64(lsn), err
}

// addWatch registers a running watch for Progress, which signals the returned channel.
func (s *Source) addWatch() chan struct{} {
	c := make(chan struct{}, 1)
	s.mu.Lock()
	s.watches[c] = true
	s.mu.Unlock()
	return c
}

func (s *Source) dropWatch(c chan struct{}) {
	s.mu.Lock()
	delete(s.watches, c)
	s.mu.Unlock()
}

// stream is one replication stream being read.
type stream struct {
	s    *Source
	conn *pgconn.PgConn
	out  chan<- source.Batch
	// from is where the watch started: transactions at or before it are skipped. read is
	// the position up to which everything was sent on out: what the status updates confirm.
	from, read uint64
	relations  map[uint32]*relation
	txn        *txn
	// walEnd is the last position the server said it had sent, and moved when it last grew.
	walEnd uint64
	moved  time.Time
	// heard is when the server last sent anything, and marked when the stream last sent a
	// progress mark.
	heard, marked time.Time
}

// run reads the stream until ctx ends or it fails. A server that answers none of the
// status requests for Timeout counts as unreachable: a link that drops every packet resets
// nothing, and the stream would otherwise wait for the kernel's keepalive.
func (st *stream) run(ctx context.Context, progress <-chan struct{}) error {
	status := time.Now()
	st.moved, st.heard = status, status
	for {
		if time.Since(status) >= st.s.cfg.Status {
			if err := st.status(ctx, true); err != nil {
				return err
			}
			status = time.Now()
			if err := st.unstick(ctx); err != nil {
				return err
			}
		}
		select {
		case <-progress:
			if err := st.status(ctx, true); err != nil {
				return err
			}
		default:
		}
		rctx, cancel := context.WithDeadline(ctx, status.Add(st.s.cfg.Status))
		msg, err := st.conn.ReceiveMessage(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case pgconn.Timeout(err):
			if silent := time.Since(st.heard); silent > st.s.cfg.Timeout {
				return source.MarkUnavailable(fmt.Errorf("postgres: replication stream: the server has not answered for %s", silent.Round(time.Millisecond)))
			}
			continue
		case err != nil:
			return slotError(fmt.Errorf("postgres: replication stream: %w", err))
		}
		st.heard = time.Now()
		if err := st.handle(ctx, msg); err != nil {
			return err
		}
	}
}

// status confirms what was sent on out and, with reply, asks for the server's position.
func (st *stream) status(ctx context.Context, reply bool) error {
	err := pglogrepl.SendStandbyStatusUpdate(ctx, st.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(st.read), ReplyRequested: reply})
	if err != nil {
		return fmt.Errorf("postgres: replication status: %w", err)
	}
	return nil
}

// unstick flushes the WAL when the server has said nothing new for a while and its insert
// position is past what it sent: the tail of the WAL may be a record no commit has flushed,
// which the stream would not reach until something else commits (see Progress).
func (st *stream) unstick(ctx context.Context) error {
	if time.Since(st.moved) < 5*st.s.cfg.Status {
		return nil
	}
	st.moved = time.Now()
	ctx, cancel := st.s.bounded(ctx)
	defer cancel()
	insert, err := st.s.insertLSN(ctx, st.s.pool)
	if err != nil {
		st.s.logger().Debug("postgres: reading the clock", "err", err)
		return nil // the stream itself says whether the server is gone
	}
	if insert <= st.walEnd {
		return nil
	}
	if err := st.s.flush(ctx); err != nil {
		st.s.logger().Debug("postgres: flushing the WAL", "err", err)
	}
	return nil
}

// handle handles one message of the stream.
func (st *stream) handle(ctx context.Context, msg pgproto3.BackendMessage) error {
	var cd *pgproto3.CopyData
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		cd = m
	case *pgproto3.ErrorResponse:
		return slotError(fmt.Errorf("postgres: replication stream: %w", pgconn.ErrorResponseToPgError(m)))
	case *pgproto3.CopyDone, *pgproto3.CommandComplete, *pgproto3.ReadyForQuery:
		// The server ends the stream so when it shuts down (a restart, a switchover).
		return errStreamEnded
	default:
		return fmt.Errorf("postgres: replication stream: unexpected %T", msg)
	}
	if len(cd.Data) == 0 {
		return nil
	}
	switch cd.Data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
		if err != nil {
			return fmt.Errorf("postgres: replication stream: %w", err)
		}
		if err := st.progress(ctx, uint64(ka.ServerWALEnd)); err != nil {
			return err
		}
		if ka.ReplyRequested {
			return st.status(ctx, false)
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return fmt.Errorf("postgres: replication stream: %w", err)
		}
		return st.decode(ctx, xld.WALData)
	}
	return nil
}

// progress sends a progress mark at the server's position, outside transactions: every
// transaction committed before it has been sent. Where the position has not moved, a mark
// of the clock read already goes out every Status all the same: it tells the reader that
// the stream lives.
func (st *stream) progress(ctx context.Context, end uint64) error {
	now := time.Now()
	if end > st.walEnd {
		st.walEnd, st.moved = end, now
	}
	switch {
	case st.txn != nil:
		return nil
	case end <= st.read && now.Sub(st.marked) < st.s.cfg.Status:
		return nil
	}
	st.marked = now
	return st.send(ctx, source.Batch{Clock: max(end, st.read)})
}

// send sends a batch and records what was read.
func (st *stream) send(ctx context.Context, b source.Batch) error {
	select {
	case st.out <- b:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !b.More {
		st.read = max(st.read, b.Clock)
	}
	return nil
}
