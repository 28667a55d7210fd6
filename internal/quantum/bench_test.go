package quantum

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/launch"
)

// BenchmarkClockTicksUnderIdleWatchers measures the process's CPU per clock tick published to
// a hub with 10,000 subscribers waiting in Next, as a relay's routers wait: side by side,
// subscribers that skip ticks (routers, members) and subscribers that take them
// (distributors), which every tick wakes. The assigner ticks every 20 ms while a source
// changes.
//
//	go test -run '^$' -bench BenchmarkClockTicksUnderIdleWatchers ./internal/quantum/
func BenchmarkClockTicksUnderIdleWatchers(b *testing.B) {
	for _, c := range []struct {
		name        string
		clockQuanta bool
	}{{"skip-ticks", false}, {"take-ticks", true}} {
		b.Run(c.name, func(b *testing.B) {
			h := NewHub(HubConfig{}, 1, nil, 0)
			a := start(b)
			require.NoError(b, h.Publish(Quantum{Position: Position{Term: 1, Seq: 1}, Generation: a.Generation()}, a))
			var started, seen sync.WaitGroup
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			const watchers = 10_000
			started.Add(watchers)
			seen.Add(watchers)
			for range watchers {
				s := h.Subscribe(&Position{Term: 1, Seq: 1}, c.clockQuanta)
				wg.Go(func() { follow(ctx, s, uint64(b.N)+2, &started, &seen) })
			}
			b.Cleanup(func() { cancel(); wg.Wait() })
			// A change of the map that every subscriber takes: then all wait in Next.
			publish(b, h, "b", 0)
			started.Wait()
			a, _, _ = h.Current()
			before := cpu(b)
			b.ResetTimer()
			for i := range b.N {
				q := Quantum{Position: Position{Term: 1, Seq: uint64(i) + 3}, Clock: uint64(i) + 1, Generation: a.Generation()}
				require.NoError(b, h.Publish(q, a))
			}
			if c.clockQuanta {
				seen.Wait() // every tick taken
			}
			b.ReportMetric((cpu(b)-before)*1e6/float64(b.N), "cpu-µs/tick")
		})
	}
}

// follow takes s's quanta until ctx ends: it marks started once it took the one at seq 2,
// and seen once it took the one at seq last.
func follow(ctx context.Context, s *Subscription, last uint64, started, seen *sync.WaitGroup) {
	var didStart, didSee bool
	mark := func(did *bool, wg *sync.WaitGroup) {
		if !*did {
			*did = true
			wg.Done()
		}
	}
	for {
		q, err := s.Next(ctx)
		if err != nil {
			mark(&didStart, started)
			mark(&didSee, seen)
			return
		}
		if q.Seq >= 2 {
			mark(&didStart, started)
		}
		if q.Seq >= last {
			mark(&didSee, seen)
		}
	}
}

// cpu returns the CPU time this process has used, in seconds.
func cpu(b *testing.B) float64 {
	s, err := launch.CPUSeconds(os.Getpid())
	require.NoError(b, err)
	return s
}
