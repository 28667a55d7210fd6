package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// watcherChildEnv, when set, makes this test binary a fleet of raw watchers (see
// runWatcherChild) instead of running tests: ten thousand watchers and their relays do not
// fit in one process's file descriptors, and the relays' heap is then measured alone.
const watcherChildEnv = "SLICEPLANE_WATCHER_CHILD"

// watcherSpec is what the parent asks of the child: N watchers, watcher i on the first of the
// relays ranked for "w<i>", each expecting Splits split quanta.
type watcherSpec struct {
	Relays quantum.Distributors
	N      int
	Splits int
	TLS    mtls.Config
}

// watcherResult is what the child reports once every watcher has every split, or its
// deadline has passed.
type watcherResult struct {
	P50, P99      time.Duration
	Samples, Want int
	Ended         int
	Err           string
}

// runWatcherChild connects the spec's watchers, prints "ready" once all have their map,
// prints a watcherResult as JSON once they have the splits, and returns the exit code.
func runWatcherChild(spec string) int {
	var s watcherSpec
	res := watcherResult{}
	defer func() { json.NewEncoder(os.Stdout).Encode(res) }()
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		res.Err = err.Error()
		return 1
	}
	src, err := s.TLS.Load()
	if err != nil {
		res.Err = err.Error()
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pick := func(i int) (string, string) { return s.Relays[s.Relays.Rank(fmt.Sprintf("w%d", i))[0]], "distributor" }
	lat, wait, err := watch(ctx, src, s.N, pick)
	if err != nil {
		res.Err = err.Error()
		return 1
	}
	defer wait()
	fmt.Println("ready")
	res.Want = s.N * s.Splits
	deadline := time.Now().Add(2 * time.Minute)
	for lat.count() < res.Want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	res.P50, res.P99, res.Samples, res.Ended = lat.quantile(0.5), lat.quantile(0.99), lat.count(), lat.endedCount()
	cancel()
	return 0
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
				return nil, nil, fmt.Errorf("watcher %d: %w", i, err)
			}
			wg.Go(func() {
				defer conn.Close()
				rawWatch(ctx, conn, lat, &ready)
			})
		}
		ready.Wait()
	}
	return lat, wg.Wait, nil
}

// watcherChild is the parent's side of a child fleet of watchers.
type watcherChild struct {
	cmd *exec.Cmd
	out *bufio.Scanner
}

// startWatcherChild starts the child fleet and returns once its watchers all have their map.
func startWatcherChild(b *testing.B, s watcherSpec) *watcherChild {
	spec, err := json.Marshal(s)
	require.NoError(b, err)
	c := &watcherChild{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	c.cmd.Env = append(os.Environ(), watcherChildEnv+"="+string(spec))
	c.cmd.Stderr = os.Stderr
	stdout, err := c.cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, c.cmd.Start())
	b.Cleanup(func() { c.cmd.Process.Kill(); c.cmd.Wait() })
	c.out = bufio.NewScanner(stdout)
	if !c.out.Scan() || c.out.Text() != "ready" {
		b.Fatalf("the watchers' process did not get ready: %s", c.out.Text())
	}
	return c
}

// result reads the child's result and waits for it to end.
func (c *watcherChild) result(b *testing.B) watcherResult {
	var res watcherResult
	for c.out.Scan() {
		if json.Unmarshal(c.out.Bytes(), &res) == nil {
			break
		}
	}
	c.cmd.Wait()
	return res
}
