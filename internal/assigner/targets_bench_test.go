package assigner_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// The targets benchmark runs three assigners as child processes (this test binary again,
// with targetsChildEnv set to the child's directory; the first also runs the embedded etcd,
// the others reach it at targetsEtcdEnv), and the members of every target in this process.
const (
	targetsChildEnv = "SLICEPLANE_TARGETS_ASSIGNER"
	targetsEtcdEnv  = "SLICEPLANE_TARGETS_ETCD"
	targetsTTL      = 2 * time.Second // the session TTL: a killed assigner's targets move within it
	// targetsProfileEnv, set to a directory (children inherit it), has each assigner write a
	// CPU profile of its life there, cpu-<pid>.pprof; the benchmark logs which process led
	// the first target.
	targetsProfileEnv = "SLICEPLANE_TARGETS_PROFILE"
)

// runTargetsChild runs one assigner of the targets benchmark until SIGTERM, logging JSON at
// debug level to stderr, where the parent reads each target's passes and leaderships.
func runTargetsChild() {
	dir := os.Getenv(targetsChildEnv)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if prof := os.Getenv(targetsProfileEnv); prof != "" {
		f, err := os.Create(filepath.Join(prof, fmt.Sprintf("cpu-%d.pprof", os.Getpid())))
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
	}
	endpoint := os.Getenv(targetsEtcdEnv)
	if endpoint == "" {
		etcd, err := embedetcd.Start(ctx, embedetcd.Options{Dir: filepath.Join(dir, "etcd"), Logger: log})
		if err != nil {
			log.Error("etcd", "err", err)
			os.Exit(1)
		}
		defer etcd.Close()
		endpoint = etcd.Endpoint()
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop()})
	if err != nil {
		os.Exit(1)
	}
	defer cli.Close()
	srv, err := assigner.New(assigner.Config{Client: cli, Logger: log, PassInterval: time.Second, SessionTTL: targetsTTL,
		// Every target's first map waits for its 20 members, so that the big one has its
		// 150k slices (7,500 a member) however the registrations interleave.
		Core: core.Config{NodeTTL: 10 * time.Second, FirstMapNodes: 20}})
	if err != nil {
		log.Error("assigner", "err", err)
		os.Exit(1)
	}
	serveChild(ctx, log, dir, srv, endpoint)
}

// targetProc is one assigner of the benchmark: the passes and leaderships its log reports.
type targetProc struct {
	child   *launch.Child
	dir     string
	addr    string
	logDone chan struct{}

	mu     sync.Mutex
	passes map[string][]time.Time // by target
	led    map[string]time.Time   // by target: when this assigner last began leading it
}

func startTargetProc(b *testing.B, dir, etcd string) *targetProc {
	p := &targetProc{dir: dir, logDone: make(chan struct{}), passes: map[string][]time.Time{}, led: map[string]time.Time{}}
	p.child = startChild(b, []string{targetsChildEnv + "=" + dir, targetsEtcdEnv + "=" + etcd}, p.readLog)
	p.addr = childFile(b, dir, "addr.txt", time.Now().Add(time.Minute))
	return p
}

func (p *targetProc) readLog(r io.Reader) {
	defer close(p.logDone)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var line struct {
			Time   time.Time `json:"time"`
			Msg    string    `json:"msg"`
			Target string    `json:"target"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Target == "" {
			continue
		}
		p.mu.Lock()
		switch {
		case line.Msg == "pass":
			p.passes[line.Target] = append(p.passes[line.Target], line.Time)
		case strings.HasPrefix(line.Msg, "leading"):
			p.led[line.Target] = line.Time
		}
		p.mu.Unlock()
	}
}

// intervals returns the intervals between the passes that this assigner made within
// [from, to), in seconds, of every target that keep keeps (nil: every target).
func (p *targetProc) intervals(from, to time.Time, keep func(name string) bool) []float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []float64
	for name, ts := range p.passes {
		if keep != nil && !keep(name) {
			continue
		}
		for i := 1; i < len(ts); i++ {
			if !ts[i-1].Before(from) && ts[i].Before(to) {
				out = append(out, ts[i].Sub(ts[i-1]).Seconds())
			}
		}
	}
	return out
}

func (p *targetProc) ledSince(name string, t time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.led[name]
	return at, ok && at.After(t)
}

func (p *targetProc) kill() {
	p.child.Signal(syscall.SIGKILL)
	p.child.Wait()
	<-p.logDone
}

func (p *targetProc) stop() {
	p.child.Signal(syscall.SIGTERM)
	select {
	case <-p.child.Done():
	case <-time.After(15 * time.Second): // a child that does not stop is killed
		p.child.Signal(syscall.SIGKILL)
	}
	p.child.Wait()
	<-p.logDone
}

// every calls fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// leaderConn returns a connection to target name's leader, closed when ctx ends.
func leaderConn(ctx context.Context, b *testing.B, name string, addrs []string) *grpc.ClientConn {
	conn, err := dial.TargetLeader(name, addrs, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		b.Fatal(err)
	}
	context.AfterFunc(ctx, func() { conn.Close() })
	return conn
}

// membersOf runs members of target name: each registers with the target's leader and
// heartbeats every second until ctx ends.
func membersOf(ctx context.Context, b *testing.B, name string, n int, addrs []string, wg *sync.WaitGroup) {
	conn := leaderConn(ctx, b, name, addrs)
	nodes := pb.NewNodeServiceClient(conn)
	for i := range n {
		id := fmt.Sprintf("%s-m%d", name, i)
		wg.Go(func() {
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := nodes.Register(cctx, &pb.RegisterRequest{Node: &pb.Node{Id: id, Capacity: 1}, Address: "127.0.0.1:1"})
				cancel()
				if err == nil {
					break
				}
			}
			every(ctx, time.Second, func() {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, _ = nodes.Heartbeat(cctx, &pb.HeartbeatRequest{NodeId: id})
				cancel()
			})
		})
	}
}

// BenchmarkAssignerTargets: 100 targets of 20 members each on 3 assigner processes. It
// reports the p99 and max of every target's pass interval (target: the pass interval, 1 s,
// + 100 ms), each assigner's CPU and memory per target it leads, then kills one assigner
// and reports how long its targets took to be led again (target: the session TTL, 2 s, +
// 1 s) and the others' pass intervals meanwhile. Run with -benchtime 1x.
//
// big=on makes the first target 150k slices (7,500 a member) beside 99 small ones, and
// reports how many small targets its assigner leads (none, the big one being heavy:
// target.Place) and the pass intervals of those it does (target: unchanged within 100 ms).
func BenchmarkAssignerTargets(b *testing.B) {
	for _, big := range []bool{false, true} {
		b.Run(fmt.Sprintf("big=%v", map[bool]string{false: "off", true: "on"}[big]), func(b *testing.B) {
			kind := plainFirst
			if big {
				kind = bigFirst
			}
			for b.Loop() {
				benchTargets(b, 100, 20, kind)
			}
		})
	}
}

// BenchmarkAssignerTargetsHostile is BenchmarkAssignerTargets with a hostile first target:
// hostile=flood, whose 20 members send 5,000 load reports a second beside their heartbeats; hostile=crashloop, whose 20 members each register as a new process, beat for a
// second and vanish, over and over. It reports the pass intervals of the other targets its
// assigner leads (target: within 100 ms of the pass interval).
func BenchmarkAssignerTargetsHostile(b *testing.B) {
	for _, kind := range []firstKind{floodFirst, crashFirst} {
		b.Run("hostile="+string(kind), func(b *testing.B) {
			for b.Loop() {
				benchTargets(b, 100, 20, kind)
			}
		})
	}
}

// firstKind is what the benchmark's first target is: like the others, or big, or hostile.
type firstKind string

const (
	plainFirst firstKind = ""
	bigFirst   firstKind = "big"
	floodFirst firstKind = "flood"
	crashFirst firstKind = "crashloop"
)

// bigTarget is the config of a target of 150k slices over 20 members.
const bigTarget = "params: {initial_slices_per_node: \"7500\", min_slices_per_node: \"50\", max_slices_per_node: \"8000\"}\n"

func benchTargets(b *testing.B, targets, members int, kind firstKind) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	procs := []*targetProc{startTargetProc(b, b.TempDir(), "")}
	etcd := childFile(b, procs[0].dir, "etcd.txt", time.Now().Add(time.Minute))
	procs = append(procs, startTargetProc(b, b.TempDir(), etcd), startTargetProc(b, b.TempDir(), etcd))
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	addrs := []string{procs[0].addr, procs[1].addr, procs[2].addr}
	names := createTargets(ctx, b, addrs, targets, kind == bigFirst)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, name := range names {
		if i == 0 && kind == crashFirst {
			crashLoop(ctx, b, name, members, addrs, &wg)
			continue
		}
		membersOf(ctx, b, name, members, addrs, &wg)
	}
	var flooded atomic.Int64
	if kind == floodFirst {
		flood(ctx, b, names[0], members, addrs, &wg, &flooded)
	}
	time.Sleep(15 * time.Second) // registrations, first maps, warm-up
	from := time.Now()
	cpu0 := cpus(b, procs)
	time.Sleep(30 * time.Second)
	to := time.Now()
	cpu1 := cpus(b, procs)
	var all []float64
	for i, p := range procs {
		iv := p.intervals(from, to, nil)
		all = append(all, iv...)
		led := leads(p, names, from)
		b.Logf("assigner %d: leads %d targets, %.3f cores (%.1f ms of CPU a second per target), RSS %.0f MiB",
			i, led, (cpu1[i]-cpu0[i])/to.Sub(from).Seconds(), 1000*(cpu1[i]-cpu0[i])/to.Sub(from).Seconds()/float64(max(led, 1)), rssMiB(b, p))
	}
	b.ReportMetric(percentile(all, 0.99)*1000, "pass-interval-p99-ms")
	b.ReportMetric(slices.Max(all)*1000, "pass-interval-max-ms")
	if kind != plainFirst {
		reportBeside(b, procs, names[0], string(kind), from, to)
		var others []float64
		for _, p := range procs {
			others = append(others, p.intervals(from, to, func(name string) bool { return name != names[0] })...)
		}
		b.ReportMetric(percentile(others, 0.99)*1000, "others-interval-p99-ms")
	}
	switch kind {
	case bigFirst:
		b.ReportMetric(float64(slicesOf(ctx, b, names[0], addrs)), "big-slices")
	case floodFirst:
		b.ReportMetric(float64(flooded.Load())/time.Since(from.Add(-15*time.Second)).Seconds(), "flood-reports/s")
	}
	killOne(b, procs, names)
}

// reportBeside reports the pass intervals of the other targets led by the assigner that leads
// the first one (of kind), and the first one's own.
func reportBeside(b *testing.B, procs []*targetProc, first, kind string, from, to time.Time) {
	for _, p := range procs {
		p.mu.Lock()
		passes := slices.Clone(p.passes[first])
		p.mu.Unlock()
		if len(passes) == 0 || passes[len(passes)-1].Before(from) {
			continue
		}
		others := p.intervals(from, to, func(name string) bool { return name != first && name != "default" })
		own := p.intervals(from, to, func(name string) bool { return name == first })
		b.Logf("the %s target's leader: process %d, leading %d other targets", kind, p.child.Pid(), leads(p, p.names(), from)-1)
		b.ReportMetric(percentile(own, 0.99)*1000, kind+"-interval-p99-ms")
		if len(others) == 0 { // a heavy target is led alone (target.Place)
			return
		}
		b.ReportMetric(percentile(others, 0.99)*1000, "beside-"+kind+"-p99-ms")
		b.ReportMetric(slices.Max(others)*1000, "beside-"+kind+"-max-ms")
		return
	}
	b.Errorf("no assigner led the %s target", kind)
}

// floodEvery is how often each flooding member sends a report: 250 a second each, 5,000 a
// second for 20 members, 250 times what the target's members send. Unpaced, the flood's
// clients took the cores the assigners run on (they share the machine), which says nothing
// of isolation inside an assigner.
const floodEvery = 4 * time.Millisecond

// flood sends target name's leader a load report every floodEvery from each of n clients,
// as the target's members (membersOf registers them), until ctx ends, counting them in
// sent. Each report covers the whole key space in 64 ranges, whatever the member holds.
func flood(ctx context.Context, b *testing.B, name string, n int, addrs []string, wg *sync.WaitGroup, sent *atomic.Int64) {
	conn := leaderConn(ctx, b, name, addrs)
	req := func(id string) *pb.ReportLoadRequest {
		r := &pb.ReportLoadRequest{NodeId: id, Window: durationpb.New(time.Second)}
		const step = ^uint64(0) / 64
		for i := range uint64(64) {
			r.Starts, r.Ends, r.Loads = append(r.Starts, i*step), append(r.Ends, (i+1)*step), append(r.Loads, 1000)
		}
		return r
	}
	for i := range n {
		r := req(fmt.Sprintf("%s-m%d", name, i))
		wg.Go(func() {
			every(ctx, floodEvery, func() {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, _ = pb.NewNodeServiceClient(conn).ReportLoad(cctx, r)
				cancel()
				sent.Add(1)
			})
		})
	}
}

// crashLoop runs n members of target name that crash over and over: each registers as a new
// process (a new incarnation), heartbeats for a second, and vanishes without leaving, then
// comes back a fifth of a second later.
func crashLoop(ctx context.Context, b *testing.B, name string, n int, addrs []string, wg *sync.WaitGroup) {
	conn := leaderConn(ctx, b, name, addrs)
	nodes := pb.NewNodeServiceClient(conn)
	for i := range n {
		id := fmt.Sprintf("%s-m%d", name, i)
		wg.Go(func() {
			for life := 0; ctx.Err() == nil; life++ {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := nodes.Register(cctx, &pb.RegisterRequest{Node: &pb.Node{Id: id, Capacity: 1}, Address: "127.0.0.1:1",
					Incarnation: fmt.Sprintf("life-%d", life)})
				cancel()
				for beat := 0; err == nil && beat < 5 && ctx.Err() == nil; beat++ {
					time.Sleep(200 * time.Millisecond)
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err = nodes.Heartbeat(cctx, &pb.HeartbeatRequest{NodeId: id})
					cancel()
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
}

// slicesOf returns how many slices target name's map has.
func slicesOf(ctx context.Context, b *testing.B, name string, addrs []string) uint32 {
	conn, err := dial.TargetLeader(name, addrs, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := pb.NewAdminServiceClient(conn).Status(cctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		b.Fatal(err)
	}
	return st.GetSlices()
}

// names returns the targets p made passes of.
func (p *targetProc) names() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Keys(p.passes))
}

// leads counts the targets p led at t, by the passes it made after t.
func leads(p *targetProc, names []string, t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, name := range names {
		if ts := p.passes[name]; len(ts) > 0 && ts[len(ts)-1].After(t) {
			n++
		}
	}
	return n
}

// killOne kills the assigner that leads the most targets, but the first, which runs etcd,
// and measures their failover.
func killOne(b *testing.B, procs []*targetProc, names []string) {
	now := time.Now()
	victim := slices.MaxFunc(procs[1:], func(x, y *targetProc) int {
		return leads(x, names, now.Add(-2*time.Second)) - leads(y, names, now.Add(-2*time.Second))
	})
	var moved []string
	victim.mu.Lock()
	for _, name := range names {
		if ts := victim.passes[name]; len(ts) > 0 && ts[len(ts)-1].After(now.Add(-2*time.Second)) {
			moved = append(moved, name)
		}
	}
	victim.mu.Unlock()
	killed := time.Now()
	victim.kill()
	survivors := slices.DeleteFunc(slices.Clone(procs), func(p *targetProc) bool { return p == victim })
	deadline := killed.Add(30 * time.Second)
	var worst time.Duration
	var late []string
	for _, name := range moved {
		for {
			at, ok := survivors[0].ledSince(name, killed)
			if at2, ok2 := survivors[1].ledSince(name, killed); ok2 {
				at, ok = at2, true
			}
			if ok {
				worst = max(worst, at.Sub(killed))
				break
			}
			if time.Now().After(deadline) {
				late = append(late, name)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if len(late) > 0 {
		b.Errorf("targets %v were not led again within 30 s of the kill", late)
	}
	time.Sleep(5 * time.Second)
	var others []float64
	for _, p := range survivors {
		others = append(others, p.intervals(killed, time.Now(), nil)...)
	}
	b.ReportMetric(worst.Seconds()*1000, "kill-releads-max-ms")
	b.ReportMetric(float64(len(moved)), "kill-moved-targets")
	b.ReportMetric(percentile(others, 0.99)*1000, "kill-others-interval-p99-ms")
	procs[slices.Index(procs, victim)] = survivors[0] // stopped once, by the caller's defer
}

func createTargets(ctx context.Context, b *testing.B, addrs []string, n int, big bool) []string {
	conn, err := dial.Leader(addrs, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	var names []string
	for i := range n {
		name := fmt.Sprintf("t%03d", i)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		config := ""
		if big && i == 0 {
			config = bigTarget
		}
		_, err := pb.NewTargetServiceClient(conn).CreateTarget(cctx, &pb.CreateTargetRequest{Name: name, Config: config})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		names = append(names, name)
	}
	return names
}

func cpus(b *testing.B, procs []*targetProc) []float64 {
	out := make([]float64, len(procs))
	for i, p := range procs {
		s, err := launch.CPUSeconds(p.child.Pid())
		if err != nil {
			b.Fatal(err)
		}
		out[i] = s
	}
	return out
}

// rssMiB returns the resident memory of p's process.
func rssMiB(b *testing.B, p *targetProc) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.child.Pid()))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		var kb float64
		if _, err := fmt.Sscanf(line, "VmRSS: %f kB", &kb); err == nil {
			return kb / 1024
		}
	}
	return 0
}
