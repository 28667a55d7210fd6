package distributor_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// keyName names the i-th key of the workload.
func keyName(i int) []byte { return fmt.Appendf(nil, "item-%06d", i) }

// workload runs the goroutines that write, load and steer a cluster while a scenario runs.
type workload struct {
	t     *testing.T
	c     *clustertest.Cluster
	keys  int
	admin pb.AdminServiceClient

	cancel context.CancelFunc
	wg     sync.WaitGroup
	writes atomic.Int64
	moves  map[string]*atomic.Int64 // admin changes applied, by call
	// refused is the last admin change the assigner refused, which explains a scenario
	// that waits in vain for changes.
	refused atomic.Pointer[string]
}

// fill writes the first n items, with a fragment on every tenth.
func fill(t *testing.T, c *clustertest.Cluster, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if pg, ok := c.Source.(*postgres.Source); ok {
		var rows []postgres.Row
		for i := range n {
			rows = append(rows, postgres.Row{Key: keyName(i), Value: fmt.Appendf(nil, "v0-%d", i)})
			if i%10 == 0 {
				rows = append(rows, postgres.Row{Key: keyName(i), Fragment: "f0", Value: []byte("frag")})
			}
		}
		_, err := pg.Copy(ctx, rows)
		require.NoError(t, err)
		return
	}
	w := writer.New(etcdtest.Client(t, c.Etcd), "/sliceplane/data/")
	var items []writer.Item
	for i := range n {
		it := writer.Item{Key: keyName(i), Value: fmt.Appendf(nil, "v0-%d", i), HasValue: true}
		if i%10 == 0 {
			it.Fragments = []writer.Fragment{{ID: "f0", Value: []byte("frag")}}
		}
		items = append(items, it)
	}
	_, err := w.PutMany(ctx, items)
	require.NoError(t, err)
}

func startWorkload(t *testing.T, c *clustertest.Cluster, keys int) *workload {
	ctx, cancel := context.WithCancel(context.Background())
	w := &workload{t: t, c: c, keys: keys, admin: pb.NewAdminServiceClient(c.Conn()), cancel: cancel,
		moves: map[string]*atomic.Int64{"split": {}, "merge": {}, "move": {}}}
	t.Cleanup(w.stop)
	t.Cleanup(func() {
		if r := w.refused.Load(); r != nil && t.Failed() {
			t.Logf("last refused admin change: %s", *r)
		}
	})
	w.spawn(func() { w.write(ctx) })
	w.spawn(func() { w.load(ctx) })
	w.spawn(func() { w.steer(ctx) })
	return w
}

func (w *workload) spawn(fn func()) {
	w.wg.Add(1)
	go func() { defer w.wg.Done(); fn() }()
}

// stop stops the workload and waits for it.
func (w *workload) stop() {
	w.cancel()
	w.wg.Wait()
}

// write puts, deletes and changes fragments of random items, new ones included.
func (w *workload) write(ctx context.Context) {
	rng := rand.New(rand.NewPCG(1, 2))
	for ctx.Err() == nil {
		key := keyName(rng.IntN(w.keys + w.keys/10))
		var err error
		switch rng.IntN(10) {
		case 0, 1:
			_, err = w.c.Source.Delete(ctx, key)
		case 2:
			_, err = w.c.Source.PutFragment(ctx, key, fmt.Sprintf("f%d", rng.IntN(3)), []byte("x"))
		case 3:
			_, err = w.c.Source.DeleteFragment(ctx, key, "f0")
		default:
			_, err = w.c.Source.Put(ctx, key, fmt.Appendf(nil, "v%d", rng.Int()))
		}
		if err != nil && ctx.Err() == nil {
			w.t.Errorf("write: %v", err)
			return
		}
		w.writes.Add(1)
	}
}

// load records Zipf-distributed requests on the nodes that hold the keys, so that the
// assigner has imbalance to fix.
func (w *workload) load(ctx context.Context) {
	rng := rand.New(rand.NewPCG(3, 4))
	zipf := rand.NewZipf(rng, 1.2, 1, uint64(w.keys-1))
	var a *assignment.Assignment
	refresh := time.Now()
	for ctx.Err() == nil {
		if a == nil || time.Since(refresh) > 100*time.Millisecond {
			if m, _, err := w.c.Assignment(ctx); err == nil {
				a, refresh = m, time.Now()
			}
			if a == nil {
				continue
			}
		}
		nodes := w.c.Nodes()
		for range 1000 {
			key := keyName(int(zipf.Uint64()))
			_, s := a.Lookup(client.Hash(key))
			for _, id := range s.Replicas {
				if n := nodes[string(id)]; n != nil {
					n.RecordLoad(key, 1)
				}
			}
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// steer splits, merges and moves slices through the admin API, on top of what balancing
// does, so that every kind of change happens while data flows.
func (w *workload) steer(ctx context.Context) {
	rng := rand.New(rand.NewPCG(5, 6))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		a, _, err := w.c.Assignment(ctx)
		if err != nil && ctx.Err() == nil {
			r := fmt.Sprintf("reading the assignment: %v", err)
			w.refused.Store(&r)
		}
		if err != nil || a.Len() < 2 {
			continue
		}
		i := rng.IntN(a.Len() - 1)
		s := a.Slice(i)
		ref := &pb.SliceRef{Ref: &pb.SliceRef_Start{Start: s.Range.Start}}
		var call string
		switch rng.IntN(3) {
		case 0:
			call = "split"
			_, err = w.admin.Split(ctx, &pb.SplitRequest{Slice: ref}, grpc.WaitForReady(true))
		case 1:
			call = "merge"
			right := &pb.SliceRef{Ref: &pb.SliceRef_Start{Start: a.Slice(i + 1).Range.Start}}
			_, err = w.admin.Merge(ctx, &pb.MergeRequest{Left: ref, Right: right}, grpc.WaitForReady(true))
		default:
			call = "move"
			ids := make([]string, 0, len(w.c.Nodes()))
			for id := range w.c.Nodes() {
				ids = append(ids, id)
			}
			to := []string{ids[rng.IntN(len(ids))]}
			if rng.IntN(4) == 0 { // now and then, two replicas
				if other := ids[rng.IntN(len(ids))]; other != to[0] {
					to = append(to, other)
				}
			}
			_, err = w.admin.Move(ctx, &pb.MoveRequest{Slice: ref, To: to}, grpc.WaitForReady(true))
		}
		if err == nil {
			w.moves[call].Add(1)
		} else if ctx.Err() == nil {
			r := fmt.Sprintf("%s: %v", call, err)
			w.refused.Store(&r)
		}
	}
}

// scenario is one run of the data path under change.
type scenario struct {
	// during runs while the workload runs, after it has run a while.
	during func(t *testing.T, c *clustertest.Cluster)
	// distributor tunes the distributors.
	distributor func(*distributor.Config)
	// gate, if set, is the store of node n0.
	gate *gatedStore
	// after runs once the nodes converged.
	after func(t *testing.T, c *clustertest.Cluster)
	// tls runs every gRPC link with mutual TLS.
	tls bool
	// postgres, a DSN, keeps the items in PostgreSQL (clustertest.Options.Postgres).
	postgres string
}

const nodes = 6

// items is what the scenarios write before the workload starts: the 100k, or 10k
// under the race detector, which looks for races in the same code paths at a sixth of the
// speed (make test runs the scenarios at full size without it too).
var items = map[bool]int{false: 100_000, true: 10_000}[raceEnabled]

// writesAround is how many writes the workload makes before the scenario's disruption, and again
// after it: under the race detector, which writes to etcd at a sixth of the speed, fewer,
// so that a scenario's workload is seconds there too and not half a minute.
var writesAround = int64(map[bool]int{false: 500, true: 200}[raceEnabled])

// patience bounds every wait of a scenario. The waits end as soon as their condition holds
// (seconds here); the bound is wide because CI machines are slower and busier than ours.
const patience = 2 * time.Minute

// run starts 1 assigner, 2 distributors and 6 nodes, writes the items, runs the workload with
// the scenario's disruption, stops the writers and checks that every node holds exactly what
// it must (I3).
func (sc scenario) run(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Distributor: sc.distributor, TLS: sc.tls, Postgres: sc.postgres})
	c.StartDistributor("d1")
	c.StartDistributor("d2")
	for i := range nodes {
		var store clustertest.Store
		if i == 0 && sc.gate != nil {
			store = sc.gate
		}
		c.StartNode(fmt.Sprintf("n%d", i), store)
	}
	waitFor(t, patience, "every node pulls from a distributor", func() bool {
		for _, n := range c.Nodes() {
			if n.Cursor().Epoch == 0 {
				return false
			}
		}
		return true
	})
	start := time.Now()
	fill(t, c, items)
	t.Logf("filled %d items in %s", items, time.Since(start))
	start = time.Now()
	w := startWorkload(t, c, items)
	waitFor(t, patience, "the workload splits, merges and moves slices", func() bool {
		return w.writes.Load() > writesAround && w.moves["split"].Load() > 3 && w.moves["merge"].Load() > 3 && w.moves["move"].Load() > 3
	})
	if sc.during != nil {
		sc.during(t, c)
	}
	before := w.writes.Load()
	waitFor(t, patience, "more writes after the disruption", func() bool { return w.writes.Load() > before+writesAround })
	w.stop()
	t.Logf("workload ran %s", time.Since(start))
	start = time.Now()
	t.Logf("%d writes; admin changes: %d splits, %d merges, %d moves", w.writes.Load(),
		w.moves["split"].Load(), w.moves["merge"].Load(), w.moves["move"].Load())

	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	_, err := w.admin.Freeze(ctx, &pb.FreezeRequest{Reason: "checking convergence"}, grpc.WaitForReady(true))
	require.NoError(t, err)
	report, err := c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
	assert.Greater(t, report.Items, items/2, "the check saw the items")
	t.Logf("%s, in %s", report, time.Since(start))
	if sc.after != nil {
		sc.after(t, c)
	}
}

// poll reports whether cond holds within the time given, polling it.
func poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// waitFor polls cond until it holds, for at most within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(within, cond) {
		t.Fatalf("not within %s: %s", within, what)
	}
}

// TestDataPathConvergesWhileSlicesMove is the plain scenario. Every other one runs it with
// something more (TLS, a restart, a stall, PostgreSQL), so under the race detector, where
// each scenario takes half a minute of a busy machine, it is left to them; make test runs
// it without the race detector at full size.
func TestDataPathConvergesWhileSlicesMove(t *testing.T) {
	if raceEnabled {
		t.Skip("every other data-path scenario runs this one's workload under the race detector")
	}
	scenario{}.run(t)
}

// TestDataPathConvergesOverMutualTLS is the same, with every call authenticated and
// authorized: nodes, distributors, the workload's admin calls. Under the race detector it
// is left to make test's full-size run, as the plain one is: the code TLS adds (credentials,
// the role checks) races with nothing the other scenarios do not run, and the smaller TLS
// tests of this package (pulls authorized, certificates rotated) run under it.
func TestDataPathConvergesOverMutualTLS(t *testing.T) {
	if raceEnabled {
		t.Skip("the TLS tests of this package run under the race detector; this workload runs in every other scenario")
	}
	scenario{tls: true}.run(t)
}

func TestDataPathNodeRestartResumesFromItsCursor(t *testing.T) {
	var before client.Cursor
	scenario{during: func(t *testing.T, c *clustertest.Cluster) {
		n := c.Nodes()["n1"]
		n.Stop()
		before = n.Cursor()
		require.NotZero(t, before.Epoch, "n1 applied a snapshot before it stopped")
		time.Sleep(200 * time.Millisecond) // writes go on while it is down
		restarted := c.StartNode("n1", n.Store)
		waitFor(t, patience, "n1 resumes", func() bool { return restarted.Cursor().Index > before.Index })
		assert.Equal(t, before.Epoch, restarted.Cursor().Epoch, "n1 resumed from its cursor, without a snapshot")
	}}.run(t)
}

func TestDataPathDistributorRestart(t *testing.T) {
	scenario{during: restartD1}.run(t)
}

// TestDataPathFromPostgres runs the data path over a PostgreSQL table: every scan reads the
// present, so the writes race the scans of the slices they touch as slices split, merge and
// move, and a distributor restarts (its nodes take snapshots elsewhere, then come back);
// the nodes converge all the same (I2, I3).
func TestDataPathFromPostgres(t *testing.T) {
	pg := pgtest.Start(t)
	scenario{postgres: pg.DSN, during: restartD1}.run(t)
}

// restartD1 stops distributor d1 until its nodes have moved to d2, then starts it again.
func restartD1(t *testing.T, c *clustertest.Cluster) {
	{
		moved := map[string]client.Cursor{}
		for id, n := range c.Nodes() {
			if d, _, _ := n.Distributor(); d == "d1" {
				moved[id] = n.Cursor()
			}
		}
		require.NotEmpty(t, moved, "some node pulls from d1")
		c.Distributors()["d1"].Stop()
		waitFor(t, patience, "d1's nodes move to d2 and take a snapshot there", func() bool {
			for id, cur := range moved {
				n := c.Nodes()[id]
				if d, _, _ := n.Distributor(); d != "d2" || n.Cursor().Epoch == cur.Epoch {
					return false
				}
			}
			return true
		})
		c.StartDistributor("d1")
		waitFor(t, patience, "the nodes come back to d1", func() bool {
			for id := range moved {
				if d, _, _ := c.Nodes()[id].Distributor(); d != "d1" {
					return false
				}
			}
			return true
		})
	}
}

func TestDataPathStalledNodeCatchesUpBySnapshot(t *testing.T) {
	regs := map[string]*prometheus.Registry{}
	var mu sync.Mutex
	gate := &gatedStore{Store: memstore.New()}
	var stalledAt client.Cursor
	scenario{
		gate: gate,
		distributor: func(cfg *distributor.Config) {
			cfg.MaxQueueBytes = 64 << 10
			cfg.Registry = prometheus.NewRegistry()
			mu.Lock()
			regs[cfg.ID] = cfg.Registry
			mu.Unlock()
		},
		during: func(t *testing.T, c *clustertest.Cluster) {
			// The others mostly keep up with the writes, but with queues this small one of
			// them may overflow first (a busy machine): n0 is stalled again until its own
			// queue overflowed, which its new epoch shows once it pulls.
			const overflowsTotal = "sliceplane_distributor_queue_overflows_total"
			for attempt := 1; ; attempt++ {
				before := counter(regs, &mu, overflowsTotal)
				stalledAt = gate.shut(t)
				waitFor(t, patience, "a queue overflows", func() bool { return counter(regs, &mu, overflowsTotal) > before })
				gate.open()
				if poll(10*time.Second, func() bool { return c.Nodes()["n0"].Cursor().Epoch != stalledAt.Epoch }) {
					return
				}
				require.Less(t, attempt, 5, "n0's own queue never overflowed")
			}
		},
		after: func(t *testing.T, c *clustertest.Cluster) {
			assert.NotEqual(t, stalledAt.Epoch, c.Nodes()["n0"].Cursor().Epoch, "n0 caught up by a snapshot")
		},
	}.run(t)
}

// gatedStore is a memstore that stalls its node while shut: Begin waits for the gate.
type gatedStore struct {
	*memstore.Store
	mu    sync.Mutex
	gate  chan struct{} // nil while open
	after uint64        // if not 0: shut once a delta of another epoch than this is stored
}

func (g *gatedStore) Begin(ctx context.Context) (client.Batch, error) {
	g.mu.Lock()
	if g.after != 0 && g.gate == nil {
		if c, err := g.Store.Cursor(ctx); err == nil && c.Epoch != 0 && c.Epoch != g.after {
			g.gate, g.after = make(chan struct{}), 0
		}
	}
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Store.Begin(ctx)
}

// shut stalls the node and returns the cursor it stalls at (give or take a batch in flight).
func (g *gatedStore) shut(t *testing.T) client.Cursor {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
	c, err := g.Store.Cursor(context.Background())
	require.NoError(t, err)
	return c
}

// shutAfterEpoch stalls the node once it has stored the first delta of an epoch other than
// epoch: the start of its next snapshot.
func (g *gatedStore) shutAfterEpoch(epoch uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.after = epoch
}

func (g *gatedStore) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate != nil {
		close(g.gate)
	}
	g.gate, g.after = nil, 0
}

// counter sums a counter over the registries.
func counter(regs map[string]*prometheus.Registry, mu *sync.Mutex, name string) float64 {
	mu.Lock()
	defer mu.Unlock()
	var n float64
	for _, r := range regs {
		mfs, err := r.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				n += mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
	}
	return n
}

// TestDataPathSnapshotsInSmallPieces reads every scan in pieces of 8 KiB and holds at most
// 64 KiB of it for a node (16 KiB, in deltas of 64 items, under the race detector) while
// slices move and changes wait behind the scans. Node n0 is made to take a snapshot (its
// distributor stops) and to stop acknowledging right after the snapshot's first delta: its
// scan must pause rather than read on, and pick up again at its clock once n0 takes more.
func TestDataPathSnapshotsInSmallPieces(t *testing.T) {
	regs := map[string]*prometheus.Registry{}
	var mu sync.Mutex
	gate := &gatedStore{Store: memstore.New()}
	const pauses = "sliceplane_distributor_scan_pauses_total"
	scenario{
		gate: gate,
		distributor: func(cfg *distributor.Config) {
			cfg.MaxScanAheadBytes = 64 << 10
			if raceEnabled {
				// At 10k items n0's sixth could fit in one delta of the default 1,024 ops and
				// the window, and its scan never paused: smaller deltas and window. (At 100k,
				// deltas that small make the snapshots too slow for the scenario's deadlines.)
				cfg.MaxScanAheadBytes, cfg.MaxDeltaOps = 16<<10, 64
			}
			cfg.Registry = prometheus.NewRegistry()
			mu.Lock()
			regs[cfg.ID] = cfg.Registry
			mu.Unlock()
		},
		during: func(t *testing.T, c *clustertest.Cluster) {
			n0 := c.Nodes()["n0"]
			from, _, ok := n0.Distributor()
			require.True(t, ok, "n0 pulls from a distributor")
			before := counter(regs, &mu, pauses)
			gate.shutAfterEpoch(n0.Cursor().Epoch)
			c.Distributors()[from].Stop()
			waitFor(t, patience, "n0's snapshot scan pauses for n0", func() bool { return counter(regs, &mu, pauses) > before })
			gate.open()
			c.StartDistributor(from)
		},
	}.run(t)
}
