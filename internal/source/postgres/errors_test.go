package postgres

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sliceplane/sliceplane/internal/source"
)

// TestErrorsAreClassifiedBySQLState checks the table in errors.go: what a retry mends, what it
// does not, and what a rescan does.
func TestErrorsAreClassifiedBySQLState(t *testing.T) {
	pg := func(code, msg string) error {
		return fmt.Errorf("postgres: reading: %w", &pgconn.PgError{Code: code, Message: msg})
	}
	for _, tc := range []struct {
		err  error
		slot bool // through slotError, as the replication paths do
		want source.Class
	}{
		{pg("57P01", "terminating connection due to administrator command"), false, source.Unavailable},
		{pg("57P03", "the database system is shutting down"), false, source.Unavailable},
		{pg("57P03", "the database system is starting up"), true, source.Unavailable},
		{pg("53300", "too many connections"), false, source.Unavailable},
		{pg("08006", "connection failure"), false, source.Unavailable},
		{pg("55000", "recovery is in progress"), false, source.Unavailable},
		{pg("55000", "logical decoding cannot be used while in recovery"), true, source.Unavailable},
		{pg("42P01", `relation "items" does not exist`), false, source.Misconfigured},
		{pg("42703", `column "sp_hash" does not exist`), false, source.Misconfigured},
		{pg("42704", `publication "sliceplane" does not exist`), true, source.Misconfigured},
		{pg("3D000", `database "x" does not exist`), false, source.Misconfigured},
		{pg("28P01", "password authentication failed"), false, source.Misconfigured},
		{pg("42501", "permission denied"), false, source.Misconfigured},
		{pg("55000", "logical decoding requires wal_level >= logical"), true, source.Misconfigured},
		{pg("42704", `replication slot "s" does not exist`), true, source.Compacted},
		{pg("55000", `can no longer get changes from replication slot "s"`), true, source.Compacted},
		{pg("58P01", "requested WAL segment has already been removed"), true, source.Compacted},
		{io.ErrUnexpectedEOF, false, source.Unavailable},
		{errStreamEnded, true, source.Unavailable},
		{errors.New("something nobody knew"), false, source.Unavailable},
	} {
		classify := classify
		if tc.slot {
			classify = slotError
		}
		if got := source.ClassOf(classify(tc.err)); got != tc.want {
			t.Errorf("%v (slot %v): %s, want %s", tc.err, tc.slot, got, tc.want)
		}
	}
	if err := classify(nil); err != nil {
		t.Errorf("classify(nil) = %v", err)
	}
	if !errors.Is(errStreamEnded, source.ErrEnded) {
		t.Error("the end of a stream is not source.ErrEnded")
	}
}
