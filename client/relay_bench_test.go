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

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/quantum"
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

// rawWatch watches the assignment on conn as a router does, but only reads each split
// quantum's emission time (stamped by the leader, carried unchanged by a relay), so that
// thousands of watchers fit in one process beside the cluster.
func rawWatch(ctx context.Context, conn *grpc.ClientConn, lat *latencies, ready *sync.WaitGroup) {
	stream, err := pb.NewAssignmentServiceClient(conn).WatchAssignment(ctx, &pb.WatchAssignmentRequest{},
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
	src, err := mtls.Config{Cert: f.routerTL.Cert, Key: f.routerTL.Key, CA: f.routerTL.CA}.Load()
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(b.Context())
	leader := f.c.Assigners()[0]
	lat, wait, err := watch(ctx, src, n, func(int) (string, string) { return leader, "assigner" })
	defer cancel()
	require.NoError(b, err)
	defer func() { cancel(); wait() }()
	f.splits(b, fmt.Sprintf("direct-%d", n), splits)
	require.Eventually(b, func() bool { return lat.count() >= n*splits }, 60*time.Second, 10*time.Millisecond,
		"every watcher receives every split: %d of %d", lat.count(), n*splits)
	return lat.quantile(0.5), lat.quantile(0.99)
}

// relayed runs n raw watchers of the relays in a child process and measures the
// emission-to-receipt time of splits quanta, and this process's (the relays') heap and
// stacks per watcher.
func (f *relayFleet) relayed(b *testing.B, n, splits int, relays quantum.Distributors) (watcherResult, float64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := startWatcherChild(b, watcherSpec{Relays: relays, N: n, Splits: splits,
		TLS: mtls.Config{Cert: f.routerTL.Cert, Key: f.routerTL.Key, CA: f.routerTL.CA}})
	runtime.GC()
	runtime.ReadMemStats(&after)
	f.splits(b, fmt.Sprintf("relayed-%d", n), splits)
	res := watcherResultOf(b, c)
	grown := (after.HeapInuse + after.StackInuse) - (before.HeapInuse + before.StackInuse)
	return res, float64(grown) / float64(n)
}

// splits makes n splits, 50 ms apart: each quantum is measured on its own, not behind the
// one before.
func (f *relayFleet) splits(b *testing.B, prefix string, n int) {
	for i := range n {
		f.split(b, fmt.Sprintf("%s-%d", prefix, i))
		time.Sleep(50 * time.Millisecond)
	}
}

// BenchmarkRelayFanOut measures, side by side in one run, a quantum's emission-to-receipt
// time at 100 watchers of the assigner itself and at many watchers (SLICEPLANE_RELAY_WATCHERS,
// default 150 here, 10,000 for the figures) through the three distributors relaying it, all
// over mutual TLS on loopback, in this one process. The watchers are raw streams (see
// rawWatch); the quanta are operators' splits, a few hundred bytes each.
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
		r, mem := f.relayed(b, n, 20, ids)
		b.ReportMetric(float64(d50.Microseconds())/1000, "direct-100-p50-ms")
		b.ReportMetric(float64(d99.Microseconds())/1000, "direct-100-p99-ms")
		b.ReportMetric(float64(r.P50.Microseconds())/1000, fmt.Sprintf("relayed-%d-p50-ms", n))
		b.ReportMetric(float64(r.P99.Microseconds())/1000, fmt.Sprintf("relayed-%d-p99-ms", n))
		b.ReportMetric(mem, "relay-B/watcher")
		b.ReportMetric(gauge(b, f.leader, "sliceplane_assigner_watchers"), "leader-watchers")
	}
}
