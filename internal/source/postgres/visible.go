package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// A transaction's commit record reaches the WAL, and so logical replication, a moment before
// the transaction is visible to new snapshots (its backend flushes the record first, then
// leaves the list of running transactions). A scan at the cut a distributor routed a change
// by must see that change, or the node that gains the slice never gets it: the change went
// by the old map, and the scan missed it. So the source remembers the transactions its
// watches delivered lately, and a scan takes its snapshot again until every one of them up
// to the clock asked for is visible in it (normally at once).

// delivered is a transaction a watch delivered: its 32-bit ID and commit LSN.
type delivered struct {
	xid uint32
	lsn uint64
	at  time.Time
}

// visibleWithin is how long a delivered transaction is remembered: far longer than any
// transaction stays invisible once its commit is in the WAL.
const visibleWithin = 10 * time.Second

// maxRemembered bounds the transactions remembered.
const maxRemembered = 1 << 16

// remember records a delivered transaction.
func (s *Source) remember(xid uint32, lsn uint64) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	i := 0
	for i < len(s.recent) && (now.Sub(s.recent[i].at) > visibleWithin || len(s.recent)-i >= maxRemembered) {
		i++
	}
	s.recent = append(s.recent[i:], delivered{xid: xid, lsn: lsn, at: now})
}

// pending returns the remembered transactions committed at or before clock.
func (s *Source) pending(clock uint64) []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []uint32
	for _, d := range s.recent {
		if d.lsn <= clock {
			out = append(out, d.xid)
		}
	}
	return out
}

// errNotVisible says that a scan's snapshot misses a transaction delivered before its clock.
var errNotVisible = errors.New("postgres: a delivered transaction is not visible yet")

// checkVisible takes tx's snapshot (its first statement) and checks that every transaction
// delivered up to clock is visible in it.
func (s *Source) checkVisible(ctx context.Context, tx pgx.Tx, clock uint64) error {
	var text string
	if err := tx.QueryRow(ctx, "SELECT txid_current_snapshot()::text").Scan(&text); err != nil {
		return err
	}
	snap, err := parseSnapshot(text)
	if err != nil {
		return err
	}
	for _, xid := range s.pending(clock) {
		if !snap.visible(snap.full(xid)) {
			return fmt.Errorf("%w: transaction %d", errNotVisible, xid)
		}
	}
	return nil
}

// snapshot is a txid_snapshot: transactions below xmin are done, those from xmax on had
// not started, and xip are those in between still running.
type snapshot struct {
	xmin, xmax uint64
	xip        map[uint64]bool
}

// parseSnapshot reads "xmin:xmax:xip,xip,...".
func parseSnapshot(s string) (snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snapshot{}, fmt.Errorf("postgres: a snapshot %q", s)
	}
	var snap snapshot
	var err error
	if snap.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("postgres: a snapshot %q: %w", s, err)
	}
	if snap.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("postgres: a snapshot %q: %w", s, err)
	}
	snap.xip = map[uint64]bool{}
	for x := range strings.SplitSeq(parts[2], ",") {
		if x == "" {
			continue
		}
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return snapshot{}, fmt.Errorf("postgres: a snapshot %q: %w", s, err)
		}
		snap.xip[v] = true
	}
	return snap, nil
}

// full returns the 64-bit transaction ID of a recent 32-bit one: the one nearest below the
// snapshot's xmax with those low bits.
func (sn snapshot) full(xid uint32) uint64 {
	f := sn.xmax&^0xFFFFFFFF | uint64(xid)
	if f > sn.xmax && f >= 1<<32 {
		f -= 1 << 32
	}
	return f
}

// visible reports whether a committed transaction is visible in the snapshot.
func (sn snapshot) visible(xid uint64) bool {
	return xid < sn.xmin || xid < sn.xmax && !sn.xip[xid]
}
