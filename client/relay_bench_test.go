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
	"github.com/sliceplane/sliceplane/internal/dial"
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

// fanOut connects n raw watchers, each on a connection of its own to what pick says, and
// measures the emission-to-receipt time of splits quanta.
func (f *relayFleet) fanOut(b *testing.B, n, splits int, pick func(i int) (addr, kind string)) (p50, p99 time.Duration, heapPerWatcher float64) {
	src, err := mtls.Config{Cert: f.routerTL.Cert, Key: f.routerTL.Key, CA: f.routerTL.CA}.Load()
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(b.Context())
	var wg, ready sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	lat := &latencies{}
	// Connected 250 at a time: ten thousand TLS handshakes at once on two cores outlast
	// the connection timeout, and retried, never end.
	for lo := 0; lo < n; lo += 250 {
		ready.Add(min(250, n-lo))
		for i := lo; i < min(lo+250, n); i++ {
			addr, kind := pick(i)
			conn, err := dial.Peer(addr, src.DialOption(kind))
			require.NoError(b, err)
			wg.Go(func() {
				defer conn.Close()
				rawWatch(ctx, conn, lat, &ready)
			})
		}
		ready.Wait()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	for i := range splits {
		f.split(b, fmt.Sprintf("fan-out-%d-%d", n, i))
		// Quanta 50 ms apart: each is measured on its own, not behind the one before.
		time.Sleep(50 * time.Millisecond)
	}
	require.Eventually(b, func() bool {
		lat.mu.Lock()
		defer lat.mu.Unlock()
		return len(lat.d) >= n*splits
	}, 60*time.Second, 10*time.Millisecond, "every watcher receives every split: %d of %d", len(lat.d), n*splits)
	if lat.ended > 0 {
		b.Logf("%d of %d watches ended before the measurement did", lat.ended, n)
	}
	return lat.quantile(0.5), lat.quantile(0.99), float64(after.HeapInuse-before.HeapInuse) / float64(n)
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
	leader := f.c.Assigners()[0]
	ids := quantum.Distributors{}
	for id, p := range f.c.Distributors() {
		ids[id] = p.Addr
	}
	for b.Loop() {
		d50, d99, _ := f.fanOut(b, 100, 20, func(int) (string, string) { return leader, "assigner" })
		r50, r99, heap := f.fanOut(b, n, 20, func(i int) (string, string) {
			return ids[ids.Rank(fmt.Sprintf("w%d", i))[0]], "distributor"
		})
		b.ReportMetric(float64(d50.Microseconds())/1000, "direct-100-p50-ms")
		b.ReportMetric(float64(d99.Microseconds())/1000, "direct-100-p99-ms")
		b.ReportMetric(float64(r50.Microseconds())/1000, fmt.Sprintf("relayed-%d-p50-ms", n))
		b.ReportMetric(float64(r99.Microseconds())/1000, fmt.Sprintf("relayed-%d-p99-ms", n))
		b.ReportMetric(heap, "heap-B/watcher")
		b.ReportMetric(gauge(b, f.leader, "sliceplane_assigner_watchers"), "leader-watchers")
	}
}
