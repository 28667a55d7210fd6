package ratelimiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sliceplane/sliceplane/client"
)

// ErrTooMany is returned by Take for more tokens than a bucket ever holds (the burst): no
// wait would let them through.
var ErrTooMany = errors.New("ratelimiter: more tokens than the burst")

// bucket is a key's token bucket: tokens as counted at at.
type bucket struct {
	tokens float64
	at     time.Time
}

// Buckets is the member's application (client.Application): one token bucket per key, in
// memory, filling at rate tokens a second up to burst. Only the primary of a key's range
// takes from its bucket (the member's interceptor sees to it), and nothing moves with a
// range: a bucket lives where it was taken from, and a key that has none here, because it
// was never taken from here or its range came from another member, counts as full. So a
// move of a key's primary lets up to one burst more through, which is the price of keeping
// no state outside the members.
//
// A member that is no longer a range's primary drops the range's buckets: were it promoted
// again later, the buckets it kept would miss every take of the primaries between.
type Buckets struct {
	rate, burst float64
	now         func() time.Time
	log         *slog.Logger

	// One lock for every key: a take holds it for a few hundred nanoseconds, which is not
	// what limits an example's throughput.
	mu      sync.Mutex
	buckets map[string]*bucket
}

// NewBuckets returns buckets that fill at rate tokens a second up to burst, both > 0.
func NewBuckets(rate, burst float64, log *slog.Logger) (*Buckets, error) {
	if !(rate > 0) || !(burst >= 1) {
		return nil, fmt.Errorf("ratelimiter: the rate must be above 0 and the burst at least 1, not %g and %g", rate, burst)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Buckets{rate: rate, burst: burst, now: time.Now, log: log, buckets: map[string]*bucket{}}, nil
}

// level returns what b holds at now, full for no bucket. b.mu held.
func (b *Buckets) level(k *bucket, now time.Time) float64 {
	if k == nil {
		return b.burst
	}
	return min(b.burst, k.tokens+b.rate*now.Sub(k.at).Seconds())
}

// Take takes n tokens (0 takes 1) from key's bucket if it holds them all, and returns
// whether it did and what the bucket holds after.
func (b *Buckets) Take(key string, n uint32) (bool, float64, error) {
	want := float64(max(n, 1))
	if want > b.burst {
		return false, 0, fmt.Errorf("%w: %d tokens asked, a bucket holds at most %g", ErrTooMany, n, b.burst)
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.buckets[key]
	have := b.level(k, now)
	if have < want {
		return false, have, nil
	}
	if k == nil {
		k = &bucket{}
		b.buckets[key] = k
	}
	k.tokens, k.at = have-want, now
	return true, k.tokens, nil
}

// Peek returns what key's bucket holds now, taking nothing.
func (b *Buckets) Peek(key string) float64 {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.level(b.buckets[key], now)
}

// Len returns how many keys have a bucket that is not known to be full.
func (b *Buckets) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.buckets)
}

// Sweep drops the buckets that have filled up: a full bucket is what no bucket means, and
// keys taken from once would otherwise stay in memory for good.
func (b *Buckets) Sweep() {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for key, k := range b.buckets {
		if b.level(k, now) >= b.burst {
			delete(b.buckets, key)
		}
	}
}

// RefillTime is how long an empty bucket takes to fill up.
func (b *Buckets) RefillTime() time.Duration {
	return time.Duration(b.burst / b.rate * float64(time.Second))
}

// drop forgets the buckets of r's keys.
func (b *Buckets) drop(r client.Range) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for key := range b.buckets {
		if r.ContainsKey([]byte(key)) {
			delete(b.buckets, key)
		}
	}
}

// Acquire has nothing to load: the range's buckets start full.
func (b *Buckets) Acquire(_ context.Context, r client.Range, g client.Grant) error {
	b.log.Debug("acquire", "range", r, "grant", g)
	return nil
}

// Release drops r's buckets. The member calls it only once the takes running under r's grant
// have returned, so that none recreates a bucket after.
func (b *Buckets) Release(_ context.Context, r client.Range) error {
	b.log.Debug("release", "range", r)
	b.drop(r)
	return nil
}

// ChangeRole drops r's buckets on a demotion (see Buckets). A promotion, or a new token for
// a range already held as primary (a merge of slices), keeps them: the takes they counted
// were this member's, as the range's primary.
func (b *Buckets) ChangeRole(_ context.Context, r client.Range, g client.Grant) error {
	b.log.Debug("change role", "range", r, "grant", g)
	if g.Role != client.RolePrimary {
		b.drop(r)
	}
	return nil
}
