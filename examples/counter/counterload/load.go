// Package counterload increments the example counter's keys through its proxy at a set
// rate and records every outcome in a countercheck.History.
package counterload

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sliceplane/sliceplane/examples/counter/countercheck"
	"github.com/sliceplane/sliceplane/examples/counter/countermember"
)

// Config shapes the load.
type Config struct {
	// URL is the proxy's base URL, e.g. http://127.0.0.1:8080.
	URL    string
	Client *http.Client
	// Keys are counter-0 .. counter-(Keys-1), chosen uniformly; Rate, increments per second;
	// Workers, the increments in flight at most.
	Keys    int
	Rate    float64
	Workers int
	// Timeout bounds one increment, retries by the proxy included; default 10 s.
	Timeout time.Duration
}

// Load runs increments until its context ends.
type Load struct {
	cfg     Config
	history *countercheck.History
	sent    atomic.Int64
	failed  atomic.Int64
}

// New returns a load recording into h.
func New(cfg Config, h *countercheck.History) *Load {
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Workers == 0 {
		cfg.Workers = 16
	}
	return &Load{cfg: cfg, history: h}
}

// Counts returns the increments sent and failed so far.
func (l *Load) Counts() (sent, failed int64) { return l.sent.Load(), l.failed.Load() }

// Run increments until ctx ends, then waits for the increments in flight.
func (l *Load) Run(ctx context.Context) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / l.cfg.Rate))
	defer tick.Stop()
	slots := make(chan struct{}, l.cfg.Workers)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		select {
		case slots <- struct{}{}:
		default:
			continue // every worker busy: the rate is not met, rather than queue without end
		}
		key := fmt.Sprintf("counter-%d", rand.IntN(l.cfg.Keys))
		wg.Go(func() {
			defer func() { <-slots }()
			l.incr(key)
		})
	}
}

// incr sends one increment and records its outcome. It outlives the load's context: an
// increment under way is answered or times out.
func (l *Load) incr(key string) {
	l.sent.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
	defer cancel()
	n, who, err := l.send(ctx, key)
	if err != nil {
		l.failed.Add(1)
		l.history.Failed(key)
		return
	}
	l.history.Acked(key, n, who)
}

// send sends one increment of key and returns the count answered and the member that
// answered it.
func (l *Load) send(ctx context.Context, key string) (int64, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.cfg.URL+countermember.IncrPath+key, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := l.cfg.Client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, "", fmt.Errorf("counterload: %s: %s", key, resp.Status)
	}
	var res countermember.Result
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return 0, "", fmt.Errorf("counterload: %s: %w", key, err)
	}
	return res.Count, resp.Header.Get(countermember.MemberHeader), nil
}
