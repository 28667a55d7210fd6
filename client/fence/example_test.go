package fence_test

import (
	"context"
	"errors"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/fence"
)

// A primary of a sharded counter keeps its counts in PostgreSQL, in a table with each
// key's point: it claims its range, then loads it, then writes every increment through
// the fence.
func ExamplePGExec() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, fence.PGSchema); err != nil { // at every start: it is idempotent
		log.Fatal(err)
	}

	// The grant: the primary role of r, with its fencing token.
	r, token := client.Range{Start: 0, End: client.BoundAt(1 << 62)}, uint64(42)
	if err := fence.PGClaim(ctx, db, r, token); err != nil {
		log.Fatal(err) // ErrStale: a newer grant of r exists already
	}
	// Only now load r's counts (SELECT ... WHERE point BETWEEN ...): they include every
	// write of the previous primary that will ever commit.

	key := []byte("alice")
	p := client.Hash(key)
	_, err = fence.PGExec(ctx, db, p, token,
		`INSERT INTO counters (key, point, count) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET count = EXCLUDED.count`,
		string(key), fence.PGPoint(p), 8)
	if errors.Is(err, fence.ErrStale) {
		// Not r's primary any more: drop r's counts and answer the increment with an
		// error, not with 8, which was never stored.
		return
	}
	if err != nil {
		log.Fatal(err)
	}
}

// With etcd, a fence key guards the data under a prefix; every write to it is a
// transaction that compares the key.
func ExampleEtcdTxn() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	const fenceKey, token = "/app/fences/tenant-7", uint64(42)
	if err := fence.EtcdClaim(ctx, cli, fenceKey, token); err != nil {
		log.Fatal(err)
	}
	// Then read /app/data/tenant-7/, then write through the fence:
	_, err = fence.EtcdTxn(ctx, cli, fenceKey, token, clientv3.OpPut("/app/data/tenant-7/alice", "8"))
	if errors.Is(err, fence.ErrStale) {
		return // not the holder any more
	}
	if err != nil {
		log.Fatal(err)
	}
}
