package fence_test

import (
	"fmt"
	"testing"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/fence"
)

// BenchmarkPostgresWrite makes the same upsert of a counter row, plainly and through the
// fence, one at a time on a pool, so that the fence's cost shows beside a write's.
func BenchmarkPostgresWrite(b *testing.B) {
	db := newDB(b)
	ctx := b.Context()
	if _, err := db.Exec(ctx, `CREATE TABLE counters (key text PRIMARY KEY, point bigint NOT NULL, count bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	if err := fence.PGClaim(ctx, db, client.FullRange(), 1); err != nil {
		b.Fatal(err)
	}
	const upsert = `INSERT INTO counters (key, point, count) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET count = EXCLUDED.count`
	keys := make([]string, 100)
	points := make([]uint64, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
		points[i] = client.Hash([]byte(keys[i]))
	}
	b.Run("plain", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			k := i % len(keys)
			if _, err := db.Exec(ctx, upsert, keys[k], fence.PGPoint(points[k]), i); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fenced", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			k := i % len(keys)
			if _, err := fence.PGExec(ctx, db, points[k], 1, upsert, keys[k], fence.PGPoint(points[k]), i); err != nil {
				b.Fatal(err)
			}
		}
	})
}
