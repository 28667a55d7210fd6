package fence_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/client/fence"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
)

// The PostgreSQL tests share one server, started by the first that needs it, and each gets
// a database of its own: starting a server takes seconds, creating a database a few
// milliseconds.
var server struct {
	once sync.Once
	c    *pgcluster.Cluster
	dir  string
	err  error
	dbs  atomic.Int64
}

func TestMain(m *testing.M) {
	code := m.Run()
	if server.c != nil {
		if err := server.c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping PostgreSQL:", err)
		}
		os.RemoveAll(server.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func startServer() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if server.dir, server.err = os.MkdirTemp("", "fence-pg-"); server.err != nil {
		return
	}
	server.c, server.err = pgcluster.Start(ctx, server.dir, pgcluster.Options{})
}

// newDB returns a pool on a new database with fence.PGSchema applied, closed when tb ends;
// it skips tb where no PostgreSQL server is installed.
func newDB(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	server.once.Do(startServer)
	if errors.Is(server.err, pgcluster.ErrNoServer) {
		tb.Skipf("needs a PostgreSQL server: %v", server.err)
	}
	if server.err != nil {
		tb.Fatal(server.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("fence_%d", server.dbs.Add(1))
	admin, err := pgxpool.New(ctx, server.c.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(server.c.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	cfg.MaxConns = 16 // the race tests hold several connections blocked at once
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(db.Close)
	// Twice, as every start of an application applies it.
	for range 2 {
		if _, err := db.Exec(ctx, fence.PGSchema); err != nil {
			tb.Fatalf("applying PGSchema: %v", err)
		}
	}
	return db
}
