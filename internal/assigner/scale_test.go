package assigner_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/wire"
)

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

// generation returns the generation of the map f holds.
func (f *follower) generation() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.m.Generation()
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

// isHeartbeat reports whether the bytes of a watch response are a heartbeat, which an idle
// stream carries instead of a quantum.
func isHeartbeat(b []byte) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		if num == 2 && typ == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(b[n:])
			return v != 0
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return false
		}
		b = b[n+m:]
	}
	return false
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
// at p99. Run with -benchtime 1x; it takes about two minutes per variant.
//
// The variants measure what mutual TLS costs: tls=off is plaintext; tls=on secures every link
// (etcd's included) and gives every party a certificate of its own, so that the assigner
// authorizes each call as it would in production. In both every node has a connection of
// its own, as a node in its own process would: the variants differ by TLS alone.
func BenchmarkAssignerScale(b *testing.B) {
	for _, v := range []struct {
		name string
		tls  bool
	}{{"tls=off", false}, {"tls=on", true}} {
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				scale(b, shape{nodes: 1000, watchers: 100}, v.tls)
			}
		})
	}
}

// BenchmarkAssignerMembers measures the assigner under 10,000 members, 15 slices each
// (150k slices), that each heartbeat and report their load every second, over mutual TLS,
// with 10 quanta watchers (the relays). Target: the leader within one core. calls=2 sends
// a heartbeat and a ReportLoad, as members did before; calls=1 a heartbeat that carries the
// load, as they do. Run with -benchtime 1x.
func BenchmarkAssignerMembers(b *testing.B) {
	for _, v := range []struct {
		name  string
		beats beats
	}{{"calls=2", beatsApart}, {"calls=1", beatsCarry}} {
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				scale(b, shape{nodes: 10_000, watchers: 10, beats: v.beats}, true)
			}
		})
	}
}

// beats is how the benchmark's nodes heartbeat.
type beats int

const (
	beatsNone  beats = iota // they only report their load
	beatsApart              // a heartbeat, then a load report, each a call
	beatsCarry              // a heartbeat carrying the load report
)

// creds hands each party of the benchmark its certificate from a throwaway CA, or none
// (plaintext) when pki is nil.
type creds struct{ pki *mtlstest.PKI }

func newCreds(b *testing.B, secure bool) creds {
	if !secure {
		return creds{}
	}
	return creds{pki: mtlstest.New(b)}
}

// source returns the loaded certificate of kind/name; nil, plaintext, without TLS.
func (c creds) source(kind, name string) *mtls.Source {
	if c.pki == nil {
		return nil
	}
	return c.pki.Source(kind, name)
}

// childEnv names the child assigner's certificate files, if any.
func (c creds) childEnv() []string {
	if c.pki == nil {
		return nil
	}
	f := c.pki.Config("assigner", "scale")
	return []string{childCertEnv + "=" + f.Cert, childKeyEnv + "=" + f.Key, childCAEnv + "=" + f.CA}
}

// dialScale opens a connection of its own to the assigner as src (nil: plaintext), with the
// options every Sliceplane client has.
func dialScale(b *testing.B, addr string, src *mtls.Source) *grpc.ClientConn {
	conn, err := dial.Peer(addr, src.DialOption("assigner"), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	return conn
}

// nodeFleet is the simulated nodes, each with its identity, its certificate (nil without
// TLS) and its connection.
type nodeFleet struct {
	ids   []assignment.NodeID
	srcs  []*mtls.Source
	conns []*grpc.ClientConn
}

func newNodeFleet(c creds, n int) *nodeFleet {
	fl := &nodeFleet{}
	for i := range n {
		id := fmt.Sprintf("node-%04d", i)
		fl.ids = append(fl.ids, assignment.NodeID(id))
		fl.srcs = append(fl.srcs, c.source("node", id))
	}
	return fl
}

// dial opens every node's connection to the assigner at addr, and waits until all are
// ready: the TLS handshakes, which take a while, are then out of the way of registration.
func (fl *nodeFleet) dial(ctx context.Context, b *testing.B, addr string) {
	fl.conns = make([]*grpc.ClientConn, len(fl.ids))
	for i, src := range fl.srcs {
		fl.conns[i] = dialScale(b, addr, src)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	fl.each(50, func(i int) {
		conn := fl.conns[i]
		conn.Connect()
		for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
			if !conn.WaitForStateChange(ctx, s) {
				b.Errorf("node %s: no connection: %v", fl.ids[i], ctx.Err())
				return
			}
		}
	})
}

// each calls fn for every node, par at a time, and returns when all calls have.
func (fl *nodeFleet) each(par int, fn func(i int)) {
	var wg sync.WaitGroup
	for w := range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(fl.ids); i += par {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

func (fl *nodeFleet) close() {
	for _, c := range fl.conns {
		c.Close()
	}
}

func (fl *nodeFleet) register(ctx context.Context, b *testing.B) {
	fl.each(len(fl.ids), func(i int) {
		req := &pb.RegisterRequest{Node: &pb.Node{Id: string(fl.ids[i])}, Address: "127.0.0.1:1"}
		if _, err := pb.NewNodeServiceClient(fl.conns[i]).Register(ctx, req); err != nil {
			b.Error(err)
		}
	})
}

// waitStatus waits until the assigner's status satisfies ok, and returns it.
func waitStatus(ctx context.Context, b *testing.B, admin pb.AdminServiceClient, what string, ok func(*pb.StatusResponse) bool) *pb.StatusResponse {
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := admin.Status(ctx, &pb.StatusRequest{})
		if err == nil && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scaleCluster is the assigner and the nodes registered with it, balancing frozen.
type scaleCluster struct {
	proc  *assignerProc
	addr  string
	admin *grpc.ClientConn
	fleet *nodeFleet
}

func (sc *scaleCluster) stop() {
	sc.fleet.close()
	sc.admin.Close()
	sc.proc.stop()
}

// startScaleCluster starts the assigner and registers the fleet. The assigner's first map
// waits for the whole fleet (core.Config.FirstMapNodes), 150k slices over it.
func startScaleCluster(ctx context.Context, b *testing.B, c creds, fl *nodeFleet, admin *mtls.Source) *scaleCluster {
	env := append(c.childEnv(), fmt.Sprintf("%s=%d", childNodes, len(fl.ids)))
	sc := &scaleCluster{proc: startAssigner(b, b.TempDir(), env), fleet: fl}
	sc.addr = sc.proc.file(b, "addr.txt", time.Now().Add(60*time.Second))
	sc.admin = dialScale(b, sc.addr, admin)
	adminSvc := pb.NewAdminServiceClient(sc.admin)
	fl.dial(ctx, b, sc.addr)
	waitStatus(ctx, b, adminSvc, "the assigner did not lead", (*pb.StatusResponse).GetLeader)
	if _, err := adminSvc.Freeze(ctx, &pb.FreezeRequest{Reason: "benchmark set-up"}); err != nil {
		b.Fatal(err)
	}
	fl.register(ctx, b)
	st := waitStatus(ctx, b, adminSvc, "no first map", func(st *pb.StatusResponse) bool { return st.GetSlices() > 0 })
	if want := uint32(150_000 / len(fl.ids) * len(fl.ids)); st.GetSlices() != want {
		sc.stop()
		b.Fatalf("the first map has %d slices, not %d", st.GetSlices(), want)
	}
	return sc
}

// shape is a scale benchmark's fleet: nodes, quanta watchers, and how each node heartbeats
// besides reporting its load every second.
type shape struct {
	nodes, watchers int
	beats           beats
}

func scale(b *testing.B, sh shape, secure bool) {
	c := newCreds(b, secure)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc := startScaleCluster(ctx, b, c, newNodeFleet(c, sh.nodes), c.source("admin", "bench"))
	defer sc.stop()
	admin := pb.NewAdminServiceClient(sc.admin)

	var wg sync.WaitGroup
	defer func() { // before the connections close
		cancel()
		wg.Wait()
	}()
	f := &follower{}
	fo := startWatchers(ctx, b, &wg, c, sc.addr, sh.watchers, f)
	z := newZipfSpace(1000 * float64(sh.nodes))
	rc := startReporters(ctx, b, &wg, sc.fleet, f, z, sh.beats)
	startWriter(ctx, b, &wg, c, sc.proc.file(b, "etcd.txt", time.Now().Add(60*time.Second)))

	ingest, total := measure(ctx, b, sc.proc, admin, z, rc)
	st, err := admin.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		b.Errorf("status: %v", err)
	}
	cancel()
	wg.Wait()
	reportScale(b, sc.proc, fo, rc, st, ingest, total)
}

// fanout is what the watchers measured, from the emission of a quantum to its receipt.
type fanout struct {
	mu               sync.Mutex
	lags, clockLags  []float64 // quanta that change the map; clock-only quanta (ms)
	reinits, errored int
}

// startWatchers starts n watchers, each on a connection of its own as a distributor: one
// keeps f, the map, for the reporters; all the others time the quanta. It returns once every
// watcher has its first quantum.
func startWatchers(ctx context.Context, b *testing.B, wg *sync.WaitGroup, c creds, addr string, n int, f *follower) *fanout {
	src := c.source("distributor", "bench")
	fo := &fanout{}
	ready := make(chan struct{}, n)
	for w := range n {
		conn := dialScale(b, addr, src)
		quanta := pb.NewQuantaServiceClient(conn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			if w == 0 {
				follow(ctx, b, quanta, f, ready)
				return
			}
			fo.watch(ctx, b, w, quanta, ready)
		}()
	}
	for range n {
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			b.Fatal("watchers did not start")
		}
	}
	return fo
}

// watch times the quanta of one stream until ctx ends, reading only what scanQuantum needs.
func (fo *fanout) watch(ctx context.Context, b *testing.B, w int, quanta pb.QuantaServiceClient, ready chan<- struct{}) {
	stream, err := quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{}, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		b.Error(err)
		return
	}
	first := true
	for {
		var msg rawMsg
		if err := stream.RecvMsg(&msg); err != nil {
			if ctx.Err() == nil {
				fo.mu.Lock()
				if fo.errored++; fo.errored <= 3 {
					b.Logf("watcher %d ended early: %v", w, err)
				}
				fo.mu.Unlock()
			}
			return
		}
		if isHeartbeat(msg.data) {
			continue // an idle stream's, before the writer starts
		}
		at, ops, reinit, err := scanQuantum(msg.data)
		if err != nil {
			b.Errorf("watcher %d: %v", w, err)
			return
		}
		lag := float64(time.Since(at)) / 1e6
		fo.mu.Lock()
		switch {
		case first:
			first = false
			ready <- struct{}{}
		case reinit:
			fo.reinits++ // the watcher fell behind what the hub keeps
		case ops > 0:
			fo.lags = append(fo.lags, lag)
		default:
			fo.clockLags = append(fo.clockLags, lag)
		}
		fo.mu.Unlock()
	}
}

// reportCount counts the load reports sent and refused.
type reportCount struct {
	mu                sync.Mutex
	reports, rejected int64
	ingestRate        float64 // reports a second while the ingest phase was measured
}

func (rc *reportCount) sent() int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.reports
}

// startReporters has every node report its load once a second, and heartbeat as mode says,
// each on its own connection, the calls spread evenly over the second by 40 senders or more.
func startReporters(ctx context.Context, b *testing.B, wg *sync.WaitGroup, fl *nodeFleet, f *follower, z *zipfSpace, mode beats) *reportCount {
	nodes := len(fl.ids)
	senders := max(40, nodes/25) // a sender's calls wait for each other: at most 25 nodes each
	rc := &reportCount{}
	for w := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second / time.Duration(nodes/senders))
			defer tick.Stop()
			for k := w; ; k += senders {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				i := k % nodes
				svc := pb.NewNodeServiceClient(fl.conns[i])
				err := report(ctx, svc, fl.ids[i], f, z, mode)
				rc.mu.Lock()
				rc.reports++
				if err != nil && ctx.Err() == nil {
					if rc.rejected++; rc.rejected <= 3 {
						b.Logf("report rejected: %v", err)
					}
				}
				rc.mu.Unlock()
			}
		}()
	}
	return rc
}

// report has node id report its load, and heartbeat as mode says.
func report(ctx context.Context, svc pb.NodeServiceClient, id assignment.NodeID, f *follower, z *zipfSpace, mode beats) error {
	r := wire.ReportToProto(loadOf(f, z, id))
	beat := &pb.HeartbeatRequest{NodeId: string(id), Generation: f.generation()}
	switch mode {
	case beatsCarry:
		beat.Load = r
		_, err := svc.Heartbeat(ctx, beat)
		return err
	case beatsApart:
		if _, err := svc.Heartbeat(ctx, beat); err != nil {
			return err
		}
	}
	_, err := svc.ReportLoad(ctx, r)
	return err
}

// loadOf returns the report of node id: the load z puts on each slice it holds, shared
// evenly by the slice's replicas.
func loadOf(f *follower, z *zipfSpace, id assignment.NodeID) load.Report {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r := load.Report{Node: id, Window: time.Second, Samples: make([]load.Sample, 0, len(f.held[id]))}
	for _, i := range f.held[id] {
		s := f.m.Slice(i)
		r.Samples = append(r.Samples, load.Sample{Range: s.Range, Load: z.of(s.Range) / float64(len(s.Replicas)), Keys: 100})
	}
	return r
}

// startWriter has a backend write an item to the etcd at endpoint every 100 ms, so that the
// assigner emits clock-only quanta.
func startWriter(ctx context.Context, b *testing.B, wg *sync.WaitGroup, c creds, endpoint string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop(),
		TLS: c.source("admin", "writer").ClientTLS()})
	if err != nil {
		b.Fatal(err)
	}
	data := source.NewEtcd(cli, "/sliceplane/data/")
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cli.Close()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				data.Put(ctx, fmt.Appendf(nil, "item-%d", i), []byte("v"))
			}
		}
	}()
}

// measure runs the two phases and returns the assigner's CPU, in cores, in each: ingest
// alone, balancing frozen; then balancing, with the hot spots moving every 10 s.
func measure(ctx context.Context, b *testing.B, proc *assignerProc, admin pb.AdminServiceClient, z *zipfSpace, rc *reportCount) (ingest, total float64) {
	time.Sleep(5 * time.Second) // warm-up: every node has reported a few times
	cpu0, t0, sent0 := proc.cpu(b), time.Now(), rc.sent()
	profile(b, proc.dir, "ingest", 14*time.Second)
	time.Sleep(15*time.Second - time.Since(t0))
	ingest = (proc.cpu(b) - cpu0) / time.Since(t0).Seconds()
	rate := float64(rc.sent()-sent0) / time.Since(t0).Seconds()
	rc.mu.Lock()
	rc.ingestRate = rate
	rc.mu.Unlock()

	if _, err := admin.Unfreeze(ctx, &pb.UnfreezeRequest{}); err != nil {
		b.Fatal(err)
	}
	cpu2, t2 := proc.cpu(b), time.Now()
	profile(b, proc.dir, "balancing", 10*time.Second)
	for range 3 {
		time.Sleep(10*time.Second - time.Since(t2)%(10*time.Second))
		z.shift()
	}
	return ingest, (proc.cpu(b) - cpu2) / time.Since(t2).Seconds()
}

func reportScale(b *testing.B, proc *assignerProc, fo *fanout, rc *reportCount, st *pb.StatusResponse, ingest, total float64) {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	fo.mu.Lock()
	defer fo.mu.Unlock()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	b.ReportMetric(100*ingest, "ingest-cpu-%")
	b.ReportMetric(100*total, "balancing-cpu-%")
	b.ReportMetric(percentile(proc.passes, 0.5), "pass-p50-ms")
	b.ReportMetric(percentile(proc.passes, 0.99), "pass-p99-ms")
	b.ReportMetric(slices.Max(append([]float64{0}, proc.passes...)), "pass-max-ms")
	b.ReportMetric(float64(len(proc.passes)), "passes")
	b.ReportMetric(percentile(proc.computes, 0.5), "compute-p50-ms")
	b.ReportMetric(percentile(proc.computes, 0.99), "compute-p99-ms")
	persists := make([]float64, len(proc.passes))
	publishes := make([]float64, len(proc.passes))
	for i := range persists {
		persists[i] = proc.passes[i] - proc.computes[i] // the pass's write to etcd and its publication
		publishes[i] = persists[i] - proc.writes[i] - proc.commits[i]
	}
	for _, m := range []struct {
		name string
		ms   []float64
	}{{"persist", persists}, {"write", proc.writes}, {"commit", proc.commits}, {"publish", publishes}} {
		b.ReportMetric(percentile(m.ms, 0.5), m.name+"-p50-ms")
		b.ReportMetric(percentile(m.ms, 0.99), m.name+"-p99-ms")
	}
	b.ReportMetric(percentile(fo.lags, 0.5), "fanout-p50-ms")
	b.ReportMetric(percentile(fo.lags, 0.99), "fanout-p99-ms")
	b.ReportMetric(float64(len(fo.lags)), "fanout-samples")
	b.ReportMetric(percentile(fo.clockLags, 0.5), "clock-fanout-p50-ms")
	b.ReportMetric(percentile(fo.clockLags, 0.99), "clock-fanout-p99-ms")
	b.ReportMetric(float64(len(fo.clockLags)), "clock-fanout-samples")
	b.ReportMetric(float64(fo.reinits), "watcher-reinits")
	b.ReportMetric(float64(fo.errored), "watcher-errors")
	b.ReportMetric(float64(rc.reports), "reports")
	b.ReportMetric(rc.ingestRate, "ingest-reports/s")
	b.ReportMetric(float64(rc.rejected), "rejected")
	b.ReportMetric(st.GetImbalance(), "final-imbalance")
	b.ReportMetric(float64(st.GetSlices()), "slices")
}
