package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/client"
	ratelimitv1 "github.com/sliceplane/sliceplane/examples/ratelimit/proto/ratelimit/v1"
)

// memberLoad sends Take requests at the scenario's rate, each for a key drawn at random,
// through the router, and counts their outcomes.
type memberLoad struct {
	r *memberRun

	mu       sync.Mutex
	answered int
	failures []failure
	by       map[string]int // answers by member
}

// failure is a request that ended in an error.
type failure struct {
	key        string
	start, end time.Time
	code       codes.Code
	msg        string
}

func newMemberLoad(r *memberRun) *memberLoad { return &memberLoad{r: r, by: map[string]int{}} }

// run starts the load; stop ends it and waits for the requests in flight.
func (l *memberLoad) run(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		every := time.Duration(float64(time.Second) / l.r.sc.rate)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			key := l.r.keys[rand.IntN(len(l.r.keys))]
			wg.Go(func() { l.take(ctx, key) })
		}
	})
	var once sync.Once
	return func() { once.Do(func() { cancel(); wg.Wait() }) }
}

// deadline returns each request's deadline.
func (l *memberLoad) deadline() time.Duration {
	if l.r.sc.deadline > 0 {
		return l.r.sc.deadline
	}
	return 2 * time.Second
}

// take sends one request and counts its outcome; a request the load's own end cut short
// counts as nothing.
func (l *memberLoad) take(ctx context.Context, key string) {
	start := time.Now()
	cctx, cancel := context.WithTimeout(client.WithWriteKey(ctx, []byte(key)), l.deadline())
	defer cancel()
	resp, err := l.r.svc.Take(cctx, &ratelimitv1.TakeRequest{Key: key})
	if ctx.Err() != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		st := status.Convert(err)
		l.failures = append(l.failures, failure{key: key, start: start, end: time.Now(), code: st.Code(), msg: st.Message()})
		return
	}
	l.answered++
	l.by[resp.GetMember()]++
}

// waitAnswered waits until n more requests were answered.
func (l *memberLoad) waitAnswered(t *testing.T, n int) {
	t.Helper()
	l.mu.Lock()
	want := l.answered + n
	l.mu.Unlock()
	deadline := time.Now().Add(patience)
	for {
		l.mu.Lock()
		got := l.answered
		l.mu.Unlock()
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests answered in %s, want %d", got-(want-n), patience, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// counts returns how many requests were answered and failed, and the failures that started
// at or after since.
func (l *memberLoad) counts(since time.Time) (answered, failed int, after []failure) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.failures {
		if !f.start.Before(since) {
			after = append(after, f)
		}
	}
	return l.answered, len(l.failures), after
}

// probe sends requests for each key from from on, one after another, each with probeTry as
// its deadline (the router sends it on, as the map changes, until a member answers, or the
// deadline), until one is answered, and returns how long after from that was; a key never
// answered within the patience gets it. A request sent to a member that hangs (stopped) gets
// no answer: the next one, sent by a map that may have moved on, is what a caller would see.
func (l *memberLoad) probe(ctx context.Context, keys []string, from time.Time) map[string]time.Duration {
	out := make(map[string]time.Duration, len(keys))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Go(func() {
			d := patience
			for time.Since(from) < patience && ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(client.WithWriteKey(ctx, []byte(key)), probeTry)
				_, err := l.r.svc.Take(cctx, &ratelimitv1.TakeRequest{Key: key})
				cancel()
				if err == nil {
					d = time.Since(from)
					break
				}
			}
			mu.Lock()
			out[key] = d
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// probeTry is the deadline of one request of a probe: how late it may see a key served.
const probeTry = 300 * time.Millisecond

// quantiles returns the p50, p90, p99 and max of ds.
func quantiles(ds []time.Duration) (p50, p90, p99, top time.Duration) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.5), at(0.9), at(0.99), s[len(s)-1]
}

// showQuantiles formats quantiles of ds in milliseconds.
func showQuantiles(ds []time.Duration) string {
	p50, p90, p99, top := quantiles(ds)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond)) }
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s, max %s ms (%d)", ms(p50), ms(p90), ms(p99), ms(top), len(ds))
}
