package assigner_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	_ "net/http/pprof" // the child serves profiles
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// The scale benchmark runs the assigner in a child process, this test binary re-executed with
// childEnv set, so that its CPU is measured apart from the load generator's.
const childEnv = "SLICEPLANE_SCALE_ASSIGNER"

// runChild runs an assigner on a durable embedded etcd in the directory named by childEnv,
// writes its address to addr.txt there, and serves until SIGTERM. It logs JSON at debug level
// to stderr, where the parent reads each pass's duration.
func runChild() {
	dir := os.Getenv(childEnv)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	etcd, err := embedetcd.Start(ctx, embedetcd.Options{Dir: filepath.Join(dir, "etcd"), Logger: log})
	if err != nil {
		log.Error("etcd", "err", err)
		os.Exit(1)
	}
	defer etcd.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, Logger: zap.NewNop()})
	if err != nil {
		os.Exit(1)
	}
	defer cli.Close()
	srv, err := assigner.New(assigner.Config{
		Client: cli, Logger: log, PassInterval: time.Second,
		// A long lease: setting up 100 watchers of a 150k-slice map takes a while, and the
		// nodes only start reporting after it.
		Core: assigner.CoreConfig{NodeTTL: 10 * time.Minute, Params: map[string]string{"initial_slices_per_node": "150"}},
	})
	if err != nil {
		log.Error("assigner", "err", err)
		os.Exit(1)
	}
	if lis, err := net.Listen("tcp", "127.0.0.1:0"); err == nil { // pprof, for profiling the benchmark
		go http.Serve(lis, nil)
		os.WriteFile(filepath.Join(dir, "pprof.txt"), []byte(lis.Addr().String()), 0o644)
	}
	if err := os.WriteFile(filepath.Join(dir, "etcd.txt"), []byte(etcd.Endpoint()), 0o644); err != nil {
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(dir, "addr.txt"), []byte(srv.Addr()), 0o644); err != nil {
		os.Exit(1)
	}
	if err := srv.Run(ctx); err != nil {
		log.Error("run", "err", err)
	}
}

// zipfSpace is a load density over the key space: buckets equal in width whose weights follow
// Zipf(1.1), placed by a seeded permutation that shift() changes.
type zipfSpace struct {
	mu     sync.RWMutex
	weight []float64 // by rank
	cum    []float64 // cum[b] = load of buckets 0..b-1
	total  float64
	shifts uint64
}

const buckets = 10_000

func newZipfSpace(total float64) *zipfSpace {
	z := &zipfSpace{weight: make([]float64, buckets), total: total}
	var sum float64
	for r := range z.weight {
		z.weight[r] = math.Pow(float64(r+1), -1.1)
		sum += z.weight[r]
	}
	for r := range z.weight {
		z.weight[r] *= total / sum
	}
	z.shift()
	return z
}

func (z *zipfSpace) shift() {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.shifts++
	perm := rand.New(rand.NewPCG(z.shifts, 7)).Perm(buckets)
	z.cum = make([]float64, buckets+1)
	for b := range buckets {
		z.cum[b+1] = z.cum[b] + z.weight[perm[b]]
	}
}

// upTo returns the load of [0, p).
func (z *zipfSpace) upTo(p keyspace.Bound) float64 {
	if p.IsEnd() {
		return z.cum[buckets]
	}
	x := float64(p.Point()) / math.Exp2(64) * buckets
	b := min(int(x), buckets-1)
	return z.cum[b] + (x-float64(b))*(z.cum[b+1]-z.cum[b])
}

func (z *zipfSpace) of(r keyspace.Range) float64 {
	z.mu.RLock()
	defer z.mu.RUnlock()
	return z.upTo(r.End) - z.upTo(keyspace.At(r.Start))
}

// follower keeps the current map from a quanta stream and, per node, the slices it holds.
type follower struct {
	mu   sync.RWMutex
	m    *assignment.Assignment
	held map[assignment.NodeID][]int
}

func (f *follower) apply(q *pb.Quantum) error {
	var next *assignment.Assignment
	var err error
	if q.GetReinitializing() {
		next, err = wire.AssignmentFromProto(q.GetAssignment())
	} else if len(q.GetOps()) > 0 {
		ops, e := wire.OpsFromProto(q.GetOps())
		if e != nil {
			return e
		}
		f.mu.RLock()
		next, err = f.m.Apply(ops)
		f.mu.RUnlock()
	} else {
		return nil
	}
	if err != nil {
		return err
	}
	held := map[assignment.NodeID][]int{}
	for i, s := range next.All() {
		for _, id := range s.Replicas {
			held[id] = append(held[id], i)
		}
	}
	f.mu.Lock()
	f.m, f.held = next, held
	f.mu.Unlock()
	return nil
}

// profile saves a CPU profile of the assigner into $SLICEPLANE_SCALE_PROFILES/<name>.pprof
// when that variable is set, and returns once it is taken.
func profile(b *testing.B, dir, name string, d time.Duration) {
	out := os.Getenv("SLICEPLANE_SCALE_PROFILES")
	if out == "" {
		return
	}
	addr, err := os.ReadFile(filepath.Join(dir, "pprof.txt"))
	if err != nil {
		b.Logf("no pprof address: %v", err)
		return
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())))
	if err != nil {
		b.Logf("profile: %v", err)
		return
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	os.WriteFile(filepath.Join(out, name+".pprof"), data, 0o644)
}

// rawCodec hands watchers the bytes of each response, undecoded: fan-out is measured to the
// receipt of a quantum, not to the end of its decoding by 100 watchers sharing two cores.
type rawCodec struct{}

type rawMsg struct{ data []byte }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*rawMsg).data = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// scanQuantum reads, from the bytes of a watch response, the quantum's emission time, how
// many ops it has and whether it is reinitializing, without decoding the rest.
func scanQuantum(b []byte) (at time.Time, ops int, reinit bool, err error) {
	q, err := field(b, 1)
	if err != nil {
		return time.Time{}, 0, false, err
	}
	var sec, nsec uint64
	for len(q) > 0 {
		num, typ, n := protowire.ConsumeTag(q)
		if n < 0 {
			return time.Time{}, 0, false, protowire.ParseError(n)
		}
		q = q[n:]
		m := protowire.ConsumeFieldValue(num, typ, q)
		if m < 0 {
			return time.Time{}, 0, false, protowire.ParseError(m)
		}
		switch num {
		case 4:
			ops++
		case 5:
			v, _ := protowire.ConsumeVarint(q)
			reinit = v != 0
		case 8:
			ts, _ := protowire.ConsumeBytes(q)
			for len(ts) > 0 {
				tn, _, k := protowire.ConsumeTag(ts)
				v, l := protowire.ConsumeVarint(ts[k:])
				if tn == 1 {
					sec = v
				} else {
					nsec = v
				}
				ts = ts[k+l:]
			}
		}
		q = q[m:]
	}
	return time.Unix(int64(sec), int64(nsec)), ops, reinit, nil
}

// field returns the bytes of the first occurrence of a length-delimited field.
func field(b []byte, want protowire.Number) ([]byte, error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if num == want && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			return v, protowire.ParseError(min(m, 0))
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil, protowire.ParseError(m)
		}
		b = b[m:]
	}
	return nil, fmt.Errorf("no field %d", want)
}

// follow keeps f up to date from a quanta stream, decoding every quantum.
func follow(ctx context.Context, b *testing.B, quanta pb.QuantaServiceClient, f *follower, ready chan<- struct{}) {
	stream, err := quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{})
	if err != nil {
		b.Error(err)
		return
	}
	for first := true; ; first = false {
		resp, err := recv(stream)
		if err != nil {
			if ctx.Err() == nil {
				b.Logf("follower: %v", err)
			}
			return
		}
		if err := f.apply(resp.GetQuantum()); err != nil {
			b.Errorf("following the map: %v", err)
			return
		}
		if first {
			ready <- struct{}{}
		}
	}
}

// cpuSeconds returns the CPU time a process has used.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100, nil // clock ticks of 10 ms
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)]
}

// BenchmarkAssignerScale measures the assigner with 1,000 nodes holding 150 slices each
// (150k slices) that report their per-slice load every second, and 100 quanta watchers.
// Targets: ingest CPU <= 25% of one core; a pass, persistence to the embedded etcd included,
// <= 300 ms at p99; from the emission of a quantum to its receipt by every watcher <= 20 ms
// at p99. Run with -benchtime 1x; it takes about two minutes.
func BenchmarkAssignerScale(b *testing.B) {
	for b.Loop() {
		scale(b)
	}
}

func scale(b *testing.B) {
	const nodes, watchers = 1000, 100
	dir := b.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+dir)
	stderr, err := child.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	var passes, computes []float64 // whole passes; their computation, before persistence
	var passMu sync.Mutex
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			var line struct {
				Msg      string `json:"msg"`
				Took     int64  `json:"took"`
				Computed int64  `json:"computed"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			switch {
			case line.Msg == "pass":
				passMu.Lock()
				passes = append(passes, float64(line.Took)/1e6)
				computes = append(computes, float64(line.Computed)/1e6)
				passMu.Unlock()
			case strings.Contains(sc.Text(), `"level":"WARN"`) || strings.Contains(sc.Text(), `"level":"ERROR"`) ||
				strings.Contains(line.Msg, "leading"):
				b.Log("assigner: " + sc.Text())
			}
		}
	}()
	defer func() {
		child.Process.Signal(syscall.SIGTERM)
		child.Wait()
		<-logDone
	}()

	var addr []byte
	deadline := time.Now().Add(60 * time.Second)
	for len(addr) == 0 {
		if time.Now().After(deadline) {
			b.Fatal("the assigner did not start")
		}
		time.Sleep(50 * time.Millisecond)
		addr, _ = os.ReadFile(filepath.Join(dir, "addr.txt"))
	}
	conn, err := grpc.NewClient(string(addr), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	admin, nodeSvc, quanta := pb.NewAdminServiceClient(conn), pb.NewNodeServiceClient(conn), pb.NewQuantaServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		st, err := admin.Status(ctx, &pb.StatusRequest{})
		if err == nil && st.GetLeader() {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the assigner did not lead")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := admin.Freeze(ctx, &pb.FreezeRequest{Reason: "benchmark set-up"}); err != nil {
		b.Fatal(err)
	}
	ids := make([]assignment.NodeID, nodes)
	var wg sync.WaitGroup
	for i := range ids {
		ids[i] = assignment.NodeID(fmt.Sprintf("node-%04d", i))
	}
	for w := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < nodes; i += 50 {
				if _, err := nodeSvc.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: string(ids[i])}, Address: "127.0.0.1:1"}); err != nil {
					b.Error(err)
				}
			}
		}()
	}
	wg.Wait()

	// Watchers: one keeps the map for the reporters; all of them time the quanta that change
	// the map, from emission to receipt.
	f := &follower{}
	var lagMu sync.Mutex
	var lags, clockLags []float64 // quanta that change the map; clock-only quanta
	ready := make(chan struct{}, watchers)
	var reinits, watcherErrors int
	for w := range watchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w == 0 {
				follow(ctx, b, quanta, f, ready)
				return
			}
			// A connection of its own, as a watcher in another process would have.
			wc, err := grpc.NewClient(string(addr), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
			if err != nil {
				b.Error(err)
				return
			}
			defer wc.Close()
			stream, err := pb.NewQuantaServiceClient(wc).WatchQuanta(ctx, &pb.WatchQuantaRequest{}, grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				b.Error(err)
				return
			}
			first := true
			for {
				var msg rawMsg
				if err := stream.RecvMsg(&msg); err != nil {
					if ctx.Err() == nil {
						lagMu.Lock()
						if watcherErrors++; watcherErrors <= 3 {
							b.Logf("watcher %d ended early: %v", w, err)
						}
						lagMu.Unlock()
					}
					return
				}
				at, ops, reinit, err := scanQuantum(msg.data)
				if err != nil {
					b.Errorf("watcher %d: %v", w, err)
					return
				}
				lag := float64(time.Since(at)) / 1e6
				lagMu.Lock()
				switch {
				case first:
					first = false
					ready <- struct{}{}
				case reinit:
					reinits++ // the watcher fell behind what the hub keeps
				case ops > 0:
					lags = append(lags, lag)
				default:
					clockLags = append(clockLags, lag)
				}
				lagMu.Unlock()
			}
		}()
	}
	for range watchers {
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			b.Fatal("watchers did not start")
		}
	}

	// Reporters: every node reports once a second, spread evenly over the second.
	z := newZipfSpace(1000 * nodes)
	var reports, rejected int64
	var repMu sync.Mutex
	repCtx, stopReports := context.WithCancel(ctx)
	for w := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second / time.Duration(nodes/40))
			defer tick.Stop()
			for k := w; ; k += 40 {
				select {
				case <-repCtx.Done():
					return
				case <-tick.C:
				}
				id := ids[k%nodes]
				f.mu.RLock()
				r := load.Report{Node: id, Window: time.Second, Samples: make([]load.Sample, 0, len(f.held[id]))}
				for _, i := range f.held[id] {
					s := f.m.Slice(i)
					r.Samples = append(r.Samples, load.Sample{Range: s.Range, Load: z.of(s.Range) / float64(len(s.Replicas)), Keys: 100})
				}
				f.mu.RUnlock()
				_, err := nodeSvc.ReportLoad(repCtx, wire.ReportToProto(r))
				repMu.Lock()
				reports++
				if err != nil && repCtx.Err() == nil {
					if rejected++; rejected <= 3 {
						b.Logf("report rejected: %v", err)
					}
				}
				repMu.Unlock()
			}
		}()
	}

	// A backend writes an item every 100 ms, so the assigner emits clock-only quanta.
	etcdAddr, err := os.ReadFile(filepath.Join(dir, "etcd.txt"))
	if err != nil {
		b.Fatal(err)
	}
	etcdCli, err := clientv3.New(clientv3.Config{Endpoints: []string{string(etcdAddr)}, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer etcdCli.Close()
	data := source.NewEtcd(etcdCli, "/sliceplane/data/")
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-repCtx.Done():
				return
			case <-tick.C:
				data.Put(repCtx, fmt.Appendf(nil, "item-%d", i), []byte("v"))
			}
		}
	}()

	// Phase A: ingest alone, balancing frozen.
	time.Sleep(5 * time.Second) // warm-up: every node has reported a few times
	cpu0, err := cpuSeconds(child.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	profile(b, dir, "ingest", 14*time.Second)
	time.Sleep(15*time.Second - time.Since(t0))
	cpu1, _ := cpuSeconds(child.Process.Pid)
	ingest := (cpu1 - cpu0) / time.Since(t0).Seconds()

	// Phase B: balancing, with the hot spots moving every 10 s.
	if _, err := admin.Unfreeze(ctx, &pb.UnfreezeRequest{}); err != nil {
		b.Fatal(err)
	}
	cpu2, _ := cpuSeconds(child.Process.Pid)
	t2 := time.Now()
	profile(b, dir, "balancing", 10*time.Second)
	for range 3 {
		time.Sleep(10*time.Second - time.Since(t2)%(10*time.Second))
		z.shift()
	}
	cpu3, _ := cpuSeconds(child.Process.Pid)
	total := (cpu3 - cpu2) / time.Since(t2).Seconds()
	st, err := admin.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		b.Errorf("status: %v", err)
	}
	stopReports()
	cancel()
	wg.Wait()

	passMu.Lock()
	defer passMu.Unlock()
	b.ReportMetric(100*ingest, "ingest-cpu-%")
	b.ReportMetric(100*total, "balancing-cpu-%")
	b.ReportMetric(percentile(passes, 0.5), "pass-p50-ms")
	b.ReportMetric(percentile(passes, 0.99), "pass-p99-ms")
	b.ReportMetric(slices.Max(append([]float64{0}, passes...)), "pass-max-ms")
	b.ReportMetric(float64(len(passes)), "passes")
	b.ReportMetric(percentile(computes, 0.5), "compute-p50-ms")
	b.ReportMetric(percentile(computes, 0.99), "compute-p99-ms")
	b.ReportMetric(percentile(lags, 0.5), "fanout-p50-ms")
	b.ReportMetric(percentile(lags, 0.99), "fanout-p99-ms")
	b.ReportMetric(float64(len(lags)), "fanout-samples")
	b.ReportMetric(percentile(clockLags, 0.5), "clock-fanout-p50-ms")
	b.ReportMetric(percentile(clockLags, 0.99), "clock-fanout-p99-ms")
	b.ReportMetric(float64(len(clockLags)), "clock-fanout-samples")
	b.ReportMetric(float64(reinits), "watcher-reinits")
	b.ReportMetric(float64(watcherErrors), "watcher-errors")
	b.ReportMetric(float64(reports), "reports")
	b.ReportMetric(float64(rejected), "rejected")
	b.ReportMetric(st.GetImbalance(), "final-imbalance")
	b.ReportMetric(float64(st.GetSlices()), "slices")
}
