package client_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/testchild"
)

// latencies collects emission-to-receipt times.
type latencies struct {
	mu    sync.Mutex
	d     []time.Duration
	ended int // streams that ended before the measurement did
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// rawWatch watches the assignment on conn as a router does, with the heartbeat a router
// asks of the kind of server it watches, but only reads each split quantum's emission time
// (stamped by the leader, carried unchanged by a relay), so that thousands of watchers fit
// in one process.
func rawWatch(ctx context.Context, conn *grpc.ClientConn, kind string, lat *latencies, ready *sync.WaitGroup) {
	req := &pb.WatchAssignmentRequest{Nodes: true}
	if kind == "distributor" {
		req.Heartbeat = durationpb.New(client.RelayHeartbeat)
	}
	stream, err := pb.NewAssignmentServiceClient(conn).WatchAssignment(ctx, req,
		grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(256<<20))
	once := sync.OnceFunc(ready.Done)
	defer once()
	if err != nil {
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			if ctx.Err() == nil {
				lat.mu.Lock()
				lat.ended++
				lat.mu.Unlock()
			}
			return
		}
		q := resp.GetQuantum()
		if q.GetReinitializing() {
			once()
			continue
		}
		if strings.HasPrefix(q.GetCause(), "admin: split") {
			lat.add(time.Since(q.GetTime().AsTime()))
		}
	}
}

// reset forgets the times collected so far, for the next round of a measurement.
func (l *latencies) reset() {
	l.mu.Lock()
	l.d = l.d[:0]
	l.mu.Unlock()
}

func (l *latencies) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

func (l *latencies) endedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended
}

// direct connects n raw watchers to the leader in this process and measures the
// emission-to-receipt time of splits quanta.
func (f *relayFleet) direct(b *testing.B, n, splits int) (p50, p99 time.Duration) {
	src, err := f.router.Load()
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(b.Context())
	leader := f.c.Assigners()[0]
	lat, wait, err := watch(ctx, src, n, func(int) (string, string) { return leader, "assigner" })
	defer cancel()
	require.NoError(b, err)
	defer func() { cancel(); wait() }()
	f.splits(b, fmt.Sprintf("direct-%d", n), splits, 50*time.Millisecond)
	require.Eventually(b, func() bool { return lat.count() >= n*splits }, 60*time.Second, 10*time.Millisecond,
		"every watcher receives every split: %d of %d", lat.count(), n*splits)
	return lat.quantile(0.5), lat.quantile(0.99)
}

// fanOutProfileEnv names a directory for CPU profiles of each round, of the relays' process
// (relays-every-<round>.pprof) and of the watchers' (watchers-every-<round>.pprof).
const fanOutProfileEnv = "SLICEPLANE_FANOUT_PROFILE"

// fanOutRound is one measurement of a fan-out: Splits split quanta, Gap apart.
type fanOutRound struct {
	Name   string
	Splits int
	Gap    time.Duration
}

// relayed runs n raw watchers of the relays in a child process and measures, round by round,
// the emission-to-receipt time of the rounds' split quanta, and this process's (the relays')
// heap and stacks per watcher.
func (f *relayFleet) relayed(b *testing.B, n int, relays quantum.Distributors, rounds []fanOutRound) ([]watcherResult, float64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := startWatcherChild(b, watcherSpec{Relays: relays, N: n, TLS: f.router})
	runtime.GC()
	runtime.ReadMemStats(&after)
	var res []watcherResult
	for _, r := range rounds {
		c.Send(b, watcherRound{Name: r.Name, Splits: r.Splits})
		stop := testchild.Profile(fanOutProfileEnv, "relays-every-"+r.Name)
		f.splits(b, fmt.Sprintf("relayed-%d-%s", n, r.Name), r.Splits, r.Gap)
		res = append(res, watcherResultOf(b, c))
		stop()
	}
	c.Stop(b)
	grown := int64(after.HeapInuse+after.StackInuse) - int64(before.HeapInuse+before.StackInuse)
	return res, float64(grown) / float64(n)
}

// splits makes n splits, gap apart.
func (f *relayFleet) splits(b *testing.B, prefix string, n int, gap time.Duration) {
	for i := range n {
		f.split(b, fmt.Sprintf("%s-%d", prefix, i))
		time.Sleep(gap)
	}
}

// BenchmarkRelayFanOut measures, side by side in one run, a quantum's emission-to-receipt
// time at 100 watchers of the assigner itself and at many watchers (SLICEPLANE_RELAY_WATCHERS,
// default 150 here, 10,000 for the figures) through the three distributors relaying it, all
// over mutual TLS on loopback. The watchers are raw streams (see rawWatch); the quanta are
// operators' splits, a few hundred bytes each. The relayed watchers are measured twice: at
// the assigner's pass cadence (a quantum a second, the default --pass-interval), where each
// quantum goes out on its own, and at twenty quanta a second, where a quantum may queue
// behind the one before at every watcher (the direct watchers are measured at that rate).
// Each round is measured again on the machine's floor (see floorServer): the same
// connections with TLS alone.
//
//	SLICEPLANE_RELAY_WATCHERS=10000 go test -run '^$' -bench BenchmarkRelayFanOut -benchtime 1x -timeout 30m ./client/
func BenchmarkRelayFanOut(b *testing.B) {
	f := startRelayFleet(b)
	n := relayWatchers(b)
	ids := quantum.Distributors{}
	for id, p := range f.c.Distributors() {
		ids[id] = p.Addr
	}
	for b.Loop() {
		d50, d99 := f.direct(b, 100, 20)
		rounds := []fanOutRound{{"1s", 10, time.Second}, {"50ms", 20, 50 * time.Millisecond}}
		res, mem := f.relayed(b, n, ids, rounds)
		b.ReportMetric(float64(d50.Microseconds())/1000, "direct-100-p50-ms")
		b.ReportMetric(float64(d99.Microseconds())/1000, "direct-100-p99-ms")
		floor := f.floor(b, n, rounds)
		for i, r := range rounds {
			for kind, w := range map[string]watcherResult{"relayed": res[i], "floor": floor[i]} {
				name := fmt.Sprintf("%s-%d-every-%s", kind, n, r.Name)
				b.ReportMetric(float64(w.P50.Microseconds())/1000, name+"-p50-ms")
				b.ReportMetric(float64(w.P99.Microseconds())/1000, name+"-p99-ms")
			}
		}
		b.ReportMetric(mem, "relay-B/watcher")
		b.ReportMetric(gauge(b, f.leader, "sliceplane_assigner_watchers"), "leader-watchers")
	}
}
