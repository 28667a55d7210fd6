package distributor_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
)

// benchCluster starts 1 assigner, 2 distributors and n nodes on stores made by store, and
// waits until every node holds its slices of the settled map.
func benchCluster(b *testing.B, n int, store func() clustertest.Store) *clustertest.Cluster {
	return benchClusterTLS(b, n, store, false)
}

// benchClusterTLS is benchCluster, with mutual TLS on every gRPC link if secure.
func benchClusterTLS(b *testing.B, n int, store func() clustertest.Store, secure bool) *clustertest.Cluster {
	b.Helper()
	// The defaults of the binaries, not the quicker clocks the tests use.
	c := clustertest.New(b, clustertest.Options{
		Assigner:    func(cfg *assigner.Config) { cfg.ClockInterval = 0 },
		Distributor: func(cfg *distributor.Config) { cfg.ClockInterval = 0 },
		TLS:         secure,
	})
	c.StartDistributor("d1")
	c.StartDistributor("d2")
	for i := range n {
		c.StartNode(fmt.Sprintf("node-%03d", i), store())
	}
	settle(b, c)
	return c
}

// settle waits until every node pulls from a distributor, freezes balancing and waits until
// the nodes hold their slices: no slice moves (and no scan) during the measurement, which is
// of the data path alone.
func settle(b *testing.B, c *clustertest.Cluster) {
	b.Helper()
	waitFor(b, patience, "every node pulls from a distributor", func() bool {
		for _, n := range c.Nodes() {
			if n.Cursor().Epoch == 0 {
				return false
			}
		}
		return true
	})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := pb.NewAdminServiceClient(c.Conn()).Freeze(ctx, &pb.FreezeRequest{Reason: "benchmark"}, grpc.WaitForReady(true)); err != nil {
		b.Fatal(err)
	}
	if r, err := c.WaitConverged(ctx); err != nil {
		b.Fatalf("the cluster did not settle: %v\n%s", err, r)
	}
}

// BenchmarkBurstFill measures a burst fill end to end: 1M items with 100-byte values, written
// to the etcd source by 4 writers in transactions of 128 items, reach 100 nodes through 2
// distributors. The time runs from the first write until every node applied the last one.
// Everything (etcd, assigner, distributors, nodes) shares the machine's cores. Each run first
// writes the same items to an etcd of its own with nothing else running, the baseline the
// fill is reported against (x-etcd-alone).
func BenchmarkBurstFill(b *testing.B) { burstFill(b, 1_000_000, 100, false) }

// BenchmarkBurstFillTLS runs a smaller burst fill (200k items, 20 nodes) with plaintext and
// with mutual TLS on every gRPC link (node and distributor pulls, quanta, heartbeats), side
// by side, for the cost of TLS on the data path. Etcd is plaintext in both.
func BenchmarkBurstFillTLS(b *testing.B) {
	b.Run("plaintext", func(b *testing.B) { burstFill(b, 200_000, 20, false) })
	b.Run("mTLS", func(b *testing.B) { burstFill(b, 200_000, 20, true) })
}

// burstFill writes items to a cluster of nodes, with mutual TLS if secure.
func burstFill(b *testing.B, items, nodes int, secure bool) {
	for range b.N {
		b.StopTimer()
		alone := etcdAlone(b, items)
		c := benchClusterTLS(b, nodes, func() clustertest.Store { return memstore.New() }, secure)
		w := writer.New(etcdtest.Client(b, c.Etcd), "/sliceplane/data/")
		b.StartTimer()
		start := time.Now()
		last, err := writeItems(w, items)
		if err != nil {
			b.Fatal(err)
		}
		wrote := time.Since(start)
		elapsed := filled(b, c, last, start, items)
		b.ReportMetric(elapsed.Seconds(), "s/fill")
		b.ReportMetric(wrote.Seconds(), "s-writing/fill")
		b.ReportMetric(float64(items)/elapsed.Seconds(), "items/s")
		b.ReportMetric((elapsed - wrote).Seconds(), "s-draining/fill")
		b.ReportMetric(alone.Seconds(), "s-etcd-alone/fill")
		b.ReportMetric(elapsed.Seconds()/alone.Seconds(), "x-etcd-alone")
	}
}

// filled waits until every node of c applied clock, stops the timer and returns the time
// since start, once it checked that the nodes hold the items written and the fence of the
// settling check.
func filled(b *testing.B, c *clustertest.Cluster, clock uint64, start time.Time, items int) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := c.WaitClock(ctx, clock); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	var held int
	for _, n := range c.Nodes() {
		held += n.Store.(*memstore.Store).Len()
	}
	if want := items + 1; held != want {
		b.Fatalf("the nodes hold %d items, want %d", held, want)
	}
	return elapsed
}

// etcdAlone returns how long an embedded etcd of its own, with nothing else running, takes
// to accept items as burstFill writes them; the etcd is stopped before it returns.
func etcdAlone(b *testing.B, items int) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	// As the cluster's etcd: embedded, without fsync.
	etcd, err := embedetcd.Start(ctx, embedetcd.Options{Dir: b.TempDir(), Fast: true, LogLevel: "fatal"})
	if err != nil {
		b.Fatal(err)
	}
	defer etcd.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	start := time.Now()
	if _, err := writeItems(writer.New(cli, "/sliceplane/data/"), items); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// writeItems writes items 100-byte items with 4 writers, in transactions of the most items
// etcd takes, and returns the clock of the last.
func writeItems(w *writer.Writer, items int) (uint64, error) {
	const writers = 4
	value := make([]byte, 100)
	var last atomic.Uint64
	var g errgroup.Group
	for wi := range writers {
		g.Go(func() error {
			batch := make([]writer.Item, 0, writer.MaxTxnOps)
			for i := wi; i < items; i += writers {
				batch = append(batch, writer.Item{Key: fmt.Appendf(nil, "fill-%07d", i), Value: value, HasValue: true})
				if len(batch) == cap(batch) || i+writers >= items {
					clock, err := w.PutMany(context.Background(), batch)
					if err != nil {
						return err
					}
					for old := last.Load(); clock > old && !last.CompareAndSwap(old, clock); old = last.Load() {
					}
					batch = batch[:0]
				}
			}
			return nil
		})
	}
	err := g.Wait()
	return last.Load(), err
}

// BenchmarkChangeToApplied measures how long a change takes from its write to the source
// (the moment etcd acknowledged it, which gives it its clock) to the commit of the node's
// batch that applies it, at a steady 10k changes/s for 10 s over 100 nodes and 2
// distributors. Each change is a put of a new 100-byte item, written on its own.
func BenchmarkChangeToApplied(b *testing.B) {
	const (
		perSecond = 10_000
		duration  = 10 * time.Second
		writers   = 32 // enough in flight for the rate, at etcd's write latency
	)
	for range b.N {
		b.StopTimer()
		rec := &applyRecorder{at: map[string]time.Time{}}
		c := benchCluster(b, 100, func() clustertest.Store { return &recordingStore{Store: memstore.New(), rec: rec} })
		b.StartTimer()
		limit := rate.NewLimiter(perSecond, writers)
		ctx, cancel := context.WithTimeout(context.Background(), duration)
		var (
			mu      sync.Mutex
			written = map[string]time.Time{}
			next    atomic.Int64
		)
		var g errgroup.Group
		value := make([]byte, 100)
		for range writers {
			g.Go(func() error {
				for limit.Wait(ctx) == nil {
					key := fmt.Appendf(nil, "lat-%08d", next.Add(1))
					if _, err := c.Source.Put(context.Background(), key, value); err != nil {
						return err
					}
					now := time.Now()
					mu.Lock()
					written[string(key)] = now
					mu.Unlock()
				}
				return nil
			})
		}
		err := g.Wait()
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		waitFor(b, patience, "every change applied", func() bool { return rec.count() >= len(written) })
		b.StopTimer()
		lat := make([]time.Duration, 0, len(written))
		for key, w := range written {
			a, ok := rec.get(key)
			if !ok {
				b.Fatalf("%s was never applied", key)
			}
			lat = append(lat, a.Sub(w))
		}
		slices.Sort(lat)
		pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
		b.ReportMetric(float64(len(lat))/duration.Seconds(), "changes/s")
		b.ReportMetric(pct(0.50), "p50-ms")
		b.ReportMetric(pct(0.99), "p99-ms")
		b.ReportMetric(pct(1), "max-ms")
	}
}

// applyRecorder remembers when each key was first applied by any node.
type applyRecorder struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (r *applyRecorder) record(keys [][]byte, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		if _, ok := r.at[string(k)]; !ok {
			r.at[string(k)] = at
		}
	}
}

func (r *applyRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at)
}

func (r *applyRecorder) get(key string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.at[key]
	return t, ok
}

// recordingStore is a memstore whose batches tell the recorder which keys they put, once
// committed.
type recordingStore struct {
	*memstore.Store
	rec *applyRecorder
}

func (s *recordingStore) Begin(ctx context.Context) (client.Batch, error) {
	b, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &recordingBatch{Batch: b, rec: s.rec}, nil
}

type recordingBatch struct {
	client.Batch
	rec  *applyRecorder
	keys [][]byte
}

func (b *recordingBatch) Put(key, value []byte) error {
	b.keys = append(b.keys, key)
	return b.Batch.Put(key, value)
}

func (b *recordingBatch) Commit(c client.Cursor) error {
	if err := b.Batch.Commit(c); err != nil {
		return err
	}
	b.rec.record(b.keys, time.Now())
	return nil
}

// BenchmarkSnapshotPullTLS measures the data path alone, with plaintext and with mutual TLS
// side by side: 4 nodes that restart empty pull their whole share of 200k items of 100 bytes
// (a snapshot each) from one distributor. Writing the items is not timed; the time runs from
// the restart until every node holds its share.
func BenchmarkSnapshotPullTLS(b *testing.B) {
	b.Run("plaintext", func(b *testing.B) { snapshotPull(b, false) })
	b.Run("mTLS", func(b *testing.B) { snapshotPull(b, true) })
}

const (
	snapshotItems = 200_000
	snapshotNodes = 4
	snapshotSize  = 100
)

func snapshotPull(b *testing.B, secure bool) {
	const items, size = snapshotItems, snapshotSize
	b.StopTimer()
	c, ids, last := snapshotCluster(b, secure)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var elapsed, pulling time.Duration
	for range b.N {
		for _, n := range c.Nodes() {
			n.Stop()
		}
		b.StartTimer()
		start := time.Now()
		for _, id := range ids {
			c.StartNode(id, nil)
		}
		// The nodes register and ask for their distributor first; the pull starts when the
		// first snapshot delta arrives (the cursor's epoch).
		waitFor(b, patience, "a node pulls", func() bool {
			for _, n := range c.Nodes() {
				if n.Cursor().Epoch != 0 {
					return true
				}
			}
			return false
		})
		attached := time.Now()
		if err := c.WaitClock(ctx, last); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		pulling += time.Since(attached)
		b.StopTimer()
		held := 0
		for _, n := range c.Nodes() {
			held += n.Store.(*memstore.Store).Len()
		}
		if held < items {
			b.Fatalf("the nodes hold %d items, want at least %d", held, items)
		}
	}
	b.ReportMetric(float64(items*b.N)/elapsed.Seconds(), "items/s")
	b.ReportMetric(float64(items*size*b.N)/elapsed.Seconds()/1e6, "value-MB/s")
	b.ReportMetric(float64(items*b.N)/pulling.Seconds(), "items/s-pulling")
}

// snapshotCluster runs a cluster of one distributor and snapshotNodes nodes holding
// snapshotItems items, settled and frozen; it returns the nodes' IDs and the last write's
// clock.
func snapshotCluster(b *testing.B, secure bool) (*clustertest.Cluster, []string, uint64) {
	const items, nodes, size = snapshotItems, snapshotNodes, snapshotSize
	c := clustertest.New(b, clustertest.Options{
		Assigner:    func(cfg *assigner.Config) { cfg.ClockInterval = 0 },
		Distributor: func(cfg *distributor.Config) { cfg.ClockInterval = 0 },
		TLS:         secure,
	})
	c.StartDistributor("d1")
	w := writer.New(etcdtest.Client(b, c.Etcd), "/sliceplane/data/")
	value := make([]byte, size)
	batch := make([]writer.Item, 0, writer.MaxTxnOps)
	var last uint64
	for i := range items {
		batch = append(batch, writer.Item{Key: fmt.Appendf(nil, "snap-%07d", i), Value: value, HasValue: true})
		if len(batch) == cap(batch) || i == items-1 {
			clock, err := w.PutMany(context.Background(), batch)
			if err != nil {
				b.Fatal(err)
			}
			last, batch = clock, batch[:0]
		}
	}
	ids := make([]string, nodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("node-%d", i)
		c.StartNode(ids[i], nil)
	}
	settle(b, c)
	return c, ids, last
}

// BenchmarkPostgresFill measures a burst fill from PostgreSQL: 1M rows with 100-byte values,
// written by one COPY, reach 10 nodes through 2 distributors, each reading the table's
// changes through its own replication slot. Reported side by side from one run: the COPY
// alone (until it returns, committed) and the fill (from the COPY's start until every node
// applied it). Skips without a PostgreSQL server.
func BenchmarkPostgresFill(b *testing.B) {
	const rows, nodes = 1_000_000, 10
	for range b.N {
		b.StopTimer()
		pg := pgtest.Start(b)
		c := clustertest.New(b, clustertest.Options{
			Assigner:    func(cfg *assigner.Config) { cfg.ClockInterval = 0 },
			Distributor: func(cfg *distributor.Config) { cfg.ClockInterval = 0 },
			Postgres:    pg.DSN,
		})
		c.StartDistributor("d1")
		c.StartDistributor("d2")
		for i := range nodes {
			c.StartNode(fmt.Sprintf("node-%03d", i), memstore.New())
		}
		settle(b, c)
		src := c.Source.(*postgres.Source)
		value := make([]byte, 100)
		batch := make([]postgres.Row, rows)
		for i := range batch {
			batch[i] = postgres.Row{Key: fmt.Appendf(nil, "fill-%07d", i), Value: value}
		}
		b.StartTimer()
		start := time.Now()
		clock, err := src.Copy(context.Background(), batch)
		if err != nil {
			b.Fatal(err)
		}
		copied := time.Since(start)
		elapsed := filled(b, c, clock, start, rows)
		b.ReportMetric(copied.Seconds(), "s-copy/fill")
		b.ReportMetric(elapsed.Seconds(), "s/fill")
		b.ReportMetric(elapsed.Seconds()/copied.Seconds(), "x-copy")
	}
}
