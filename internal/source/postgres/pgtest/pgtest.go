// Package pgtest starts a throwaway PostgreSQL server for a test (pgcluster), and skips the
// test, saying why, where no PostgreSQL server binaries are installed.
package pgtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
)

// Start starts a server for t, stopped when t ends; it skips t without server binaries.
func Start(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, t.TempDir(), pgcluster.Options{})
	if errors.Is(err, pgcluster.ErrNoServer) {
		t.Skipf("needs a PostgreSQL server: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stopping PostgreSQL: %v", err)
		}
	})
	return c
}
