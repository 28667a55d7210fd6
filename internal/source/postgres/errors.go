package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sliceplane/sliceplane/internal/source"
)

// The source's errors are classified here, and only here (source.Class): every error its
// reads return (Open and Check, Clock, Watch, WatchClock, Scan, Progress, Fence) and its
// writes goes through classify.
//
//   - Compacted: the slot is gone, invalidated, or lost the WAL asked for (slotError).
//   - Misconfigured: what a retry cannot mend, by SQLSTATE: no such table, column or
//     publication (42P01, 42703, 42704), no such database (3D000), a function the server
//     lacks (42883), no privilege (42501), credentials refused (class 28), wal_level below
//     logical; and the checks of Check (a missing column, a replica identity that does not
//     name the key).
//   - Unavailable: everything else: a connection refused, lost or timed out, a server
//     shutting down (57P01, 57P02), starting up or in recovery (57P03, 55000 on a standby),
//     too many connections (53300), a failover; an error nobody recognised.

// errStreamEnded is the server ending a replication stream in order, as it does when it
// shuts down (a restart, a switchover): not a failure. It is Unavailable, and source.ErrEnded.
var errStreamEnded = source.MarkUnavailable(fmt.Errorf("postgres: %w: the server ended the replication stream (shutting down?)", source.ErrEnded))

// misconfigured are the SQLSTATEs that no retry mends.
var misconfigured = map[string]bool{
	"42P01": true, // undefined_table
	"42703": true, // undefined_column
	"42704": true, // undefined_object: a publication (a slot's is Compacted: slotError)
	"3D000": true, // invalid_catalog_name: no such database
	"42883": true, // undefined_function: a server too old
	"42501": true, // insufficient_privilege
}

// classify marks err with its class (see above). A marked error keeps its class.
func classify(err error) error {
	if err == nil || errors.Is(err, source.ErrCompacted) {
		return err
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		if misconfigured[pe.Code] || strings.HasPrefix(pe.Code, "28") ||
			pe.Code == "55000" && strings.Contains(pe.Message, "wal_level") {
			return source.MarkMisconfigured(err)
		}
	}
	if _, ok := errors.AsType[*pgconn.ParseConfigError](err); ok {
		return source.MarkMisconfigured(err)
	}
	return source.MarkUnavailable(err)
}

// failed classifies err of a request of the source's pool; an error of a connection that
// broke (a server that shut down, a link that failed) drops every idle connection of the pool
// too: they broke with it, and each would fail one more request after the server's return.
func (s *Source) failed(err error) error {
	err = classify(err)
	if broke(err) {
		s.pool.Reset()
	}
	return err
}

// broke reports whether err says its connection is gone.
func broke(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pe.Code == "57P01" || pe.Code == "57P02" || strings.HasPrefix(pe.Code, "08")
	}
	return source.ClassOf(err) == source.Unavailable
}

// slotError makes an error about a slot that is gone, or whose WAL is, source.ErrCompacted:
// the watch starts over from a later clock, after a rescan. Any other error is classified.
func slotError(err error) error {
	pe, ok := errors.AsType[*pgconn.PgError](err)
	slot := ok && strings.Contains(pe.Message, "replication slot")
	if ok && ((pe.Code == "42704" || pe.Code == "55000") && slot || pe.Code == "58P01") {
		// undefined_object (no slot), object_not_in_prerequisite_state (invalidated),
		// undefined_file (WAL removed). A server in recovery says 55000 too, of no slot.
		return fmt.Errorf("%w: %w", source.ErrCompacted, err)
	}
	return classify(err)
}
