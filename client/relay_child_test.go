package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/testchild"
)

// watcherChildEnv, when set, makes this test binary a fleet of raw watchers (see
// watcherJob) instead of running tests: ten thousand watchers and their relays do not fit
// in one process's file descriptors, and the relays' memory is then measured alone.
const watcherChildEnv = "SLICEPLANE_WATCHER_CHILD"

// watcherSpec is what the parent asks of the child: N watchers, watcher i on the first of the
// relays ranked for "w<i>".
type watcherSpec struct {
	Relays quantum.Distributors
	N      int
	TLS    mtls.Config
	// Floor, if set, is the address of a floorServer, which the child reads with N plain
	// TLS connections instead of watching relays.
	Floor string
}

// watcherRound is a measurement the parent asks for: each watcher is to receive Splits split
// quanta, which the parent makes once it has sent the request.
type watcherRound struct {
	Name   string
	Splits int
}

// watcherResult is what the child answers to a round once every watcher has every split, or
// its deadline has passed.
type watcherResult struct {
	P50, P99      time.Duration
	Samples, Want int
	Ended         int
}

// watcherJob connects the spec's watchers, says it is ready once all have their map, and
// answers each round with a watcherResult over that round's splits alone.
func watcherJob(s *watcherSpec) func(*testchild.Parent) error {
	return func(p *testchild.Parent) error {
		src, err := s.TLS.Load()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(context.Background())
		pick := func(i int) (string, string) { return s.Relays[s.Relays.Rank(fmt.Sprintf("w%d", i))[0]], "distributor" }
		var lat *latencies
		var wait func()
		if s.Floor != "" {
			lat, wait, err = readFloor(ctx, src.ClientTLS("distributor"), s.Floor, s.N)
		} else {
			lat, wait, err = watch(ctx, src, s.N, pick)
		}
		defer func() { cancel(); wait() }()
		if err != nil {
			return err
		}
		p.Ready()
		var r watcherRound
		for p.Recv(&r) {
			want := s.N * r.Splits
			stop := testchild.Profile(fanOutProfileEnv, "watchers-every-"+r.Name)
			for deadline := time.Now().Add(2 * time.Minute); lat.count() < want && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			res := watcherResult{P50: lat.quantile(0.5), P99: lat.quantile(0.99), Samples: lat.count(), Want: want, Ended: lat.endedCount()}
			lat.reset()
			if err := p.Send(res); err != nil {
				return err
			}
		}
		return nil
	}
}

// watch connects n raw watchers, each on a connection of its own to what pick says, 250 at
// a time (ten thousand TLS handshakes at once on two cores outlast the connection timeout,
// and retried, never end), and returns once each has its map; wait waits for them to end,
// after ctx.
func watch(ctx context.Context, src *mtls.Source, n int, pick func(i int) (addr, kind string)) (*latencies, func(), error) {
	var wg, ready sync.WaitGroup
	lat := &latencies{}
	for lo := 0; lo < n; lo += 250 {
		ready.Add(min(250, n-lo))
		for i := lo; i < min(lo+250, n); i++ {
			addr, kind := pick(i)
			conn, err := dial.Peer(addr, src.DialOption(kind))
			if err != nil {
				return nil, wg.Wait, fmt.Errorf("watcher %d: %w", i, err)
			}
			wg.Go(func() {
				defer conn.Close()
				rawWatch(ctx, conn, kind, lat, &ready)
			})
		}
		ready.Wait()
	}
	return lat, wg.Wait, nil
}

// startWatcherChild starts the child fleet and returns once its watchers all have their map.
func startWatcherChild(b *testing.B, s watcherSpec) *testchild.Child {
	c := testchild.Start(b, watcherChildEnv, s)
	c.Ready(b)
	return c
}

// watcherResultOf reads the child's result of a round.
func watcherResultOf(b *testing.B, c *testchild.Child) watcherResult {
	var res watcherResult
	c.Recv(b, &res)
	require.Equal(b, res.Want, res.Samples, "every watcher receives every split (%d watches ended early)", res.Ended)
	return res
}
