package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// staleness follows how far behind the source each node is while a writer writes: a node's
// staleness is the age of the oldest write it has not applied (one whose revision is above
// the clock its /v1/state reports).
type staleness struct {
	mu     sync.Mutex
	writes []timedWrite // in revision order
	worst  map[string]time.Duration
	since  time.Time // worst counts samples after since
}

type timedWrite struct {
	clock uint64
	at    time.Time
}

// write writes a new item every interval until stop is closed (not canceled mid-write, so
// that every item written is counted).
func (st *staleness) write(ctx context.Context, stop <-chan struct{}, s *scenario, interval time.Duration) error {
	for i := 0; ; i++ {
		clock, err := s.writer.Put(ctx, fmt.Appendf(nil, "stale-%d", i), fmt.Appendf(nil, "v%d", i))
		if err != nil {
			return err
		}
		st.mu.Lock()
		st.writes = append(st.writes, timedWrite{clock, time.Now()})
		st.mu.Unlock()
		select {
		case <-time.After(interval):
		case <-stop:
			return nil
		}
	}
}

// sample reads each node's clock every interval until ctx ends.
func (st *staleness) sample(ctx context.Context, nodes map[string]*kvclient.Node, interval time.Duration) {
	for ctx.Err() == nil {
		for id, n := range nodes {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			state, err := n.State(rctx)
			cancel()
			if err != nil {
				continue
			}
			st.observe(id, state.Clock, time.Now())
		}
		select {
		case <-time.After(interval):
		case <-ctx.Done():
		}
	}
}

func (st *staleness) observe(id string, clock uint64, now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	i := sort.Search(len(st.writes), func(i int) bool { return st.writes[i].clock > clock })
	if i == len(st.writes) || now.Before(st.since) {
		return
	}
	if age := now.Sub(st.writes[i].at); age > st.worst[id] {
		st.worst[id] = age
	}
}

// from resets the worst figures: only samples from now on count.
func (st *staleness) from(now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.worst, st.since = map[string]time.Duration{}, now
}

func (st *staleness) report() map[string]time.Duration {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := map[string]time.Duration{}
	for k, v := range st.worst {
		out[k] = v
	}
	return out
}

// A hung leader (SIGSTOP, longer than its session TTL) costs no more staleness than a dead
// one: the standby takes over, and distributors and nodes leave the hung leader for it.
func TestHungLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	s := startCluster(t, ctx, 1000, "n1", "n2", "n3")
	nodes := map[string]*kvclient.Node{}
	for id, url := range s.cluster.NodeURLs() {
		nodes[id] = kvclient.New(url, s.cluster.HTTPClient())
	}

	st := &staleness{}
	st.from(time.Now())
	sctx, stopSampling := context.WithCancel(ctx)
	stop := make(chan struct{})
	var once sync.Once
	stopWriting := func() { once.Do(func() { close(stop); stopSampling() }) }
	var wg sync.WaitGroup
	var writeErr error
	wg.Go(func() { writeErr = st.write(ctx, stop, s, 50*time.Millisecond) })
	wg.Go(func() { st.sample(sctx, nodes, 50*time.Millisecond) })
	defer func() { stopWriting(); wg.Wait() }()

	// Before the fault, staleness is what the pipeline costs.
	time.Sleep(2 * time.Second) //nolint:forbidigo // a sampling window, not a wait for a condition
	t.Logf("staleness before the fault: %v", st.report())

	old := s.leader()
	var standby *kvcluster.Member
	for _, m := range s.cluster.Members("assigner") {
		if m != old {
			standby = m
		}
	}
	pid := old.Proc().Pid()
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) }) //nolint:errcheck // it may have exited
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	st.from(stopped)
	takeover := s.waitLeads(standby)
	t.Logf("%s took over from the hung %s in %s", standby.ID, old.ID, takeover.Round(time.Millisecond))

	// Hang well beyond the TTL: staleness must not grow with the hang.
	time.Sleep(time.Until(stopped.Add(8 * time.Second))) //nolint:forbidigo // the length of the fault
	worst := st.report()
	t.Logf("worst staleness while %s hung: %v (takeover %s)", old.ID, worst, takeover.Round(time.Millisecond))
	if len(worst) != len(nodes) {
		t.Errorf("samples of %d nodes, want %d: %v", len(worst), len(nodes), worst)
	}
	for id, d := range worst {
		if d > takeover+2*time.Second {
			t.Errorf("node %s was %s stale; the takeover took %s: want at most takeover + 2 s", id, d.Round(time.Millisecond), takeover.Round(time.Millisecond))
		}
	}

	// The distributors noticed the hang by the silence of their quanta streams.
	for _, d := range s.cluster.Members("distributor") {
		if n := s.metric(d, "sliceplane_distributor_quanta_stream_silences_total"); n < 1 {
			t.Errorf("distributor %s counted %v silent quanta streams, want at least 1", d.ID, n)
		}
	}

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	s.waitStandby(old)
	if lead := s.leader(); lead != standby {
		t.Errorf("%s leads after %s resumed, want %s", lead.ID, old.ID, standby.ID)
	}
	stopWriting()
	wg.Wait()
	if writeErr != nil {
		t.Fatalf("writing: %v", writeErr)
	}
	st.mu.Lock()
	s.written += len(st.writes)
	st.mu.Unlock()
	s.converged("a hung leader resumed")
}

// waitLeads waits until m says it leads, polling it alone; it returns how long that took
// since the call.
func (s *scenario) waitLeads(m *kvcluster.Member) time.Duration {
	s.t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, patience)
	defer cancel()
	err := launch.WaitFor(ctx, m.ID+" to lead", 20*time.Millisecond, func(ctx context.Context) error {
		st, err := s.status(ctx, m.Addr)
		if err != nil || !st.GetLeader() {
			return fmt.Errorf("%s does not lead (%v)", m.ID, err)
		}
		return nil
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return time.Since(start)
}

// waitStandby waits until m answers and says it does not lead.
func (s *scenario) waitStandby(m *kvcluster.Member) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, patience)
	defer cancel()
	err := launch.WaitFor(ctx, m.ID+" to be a standby", 50*time.Millisecond, func(ctx context.Context) error {
		st, err := s.status(ctx, m.Addr)
		if err != nil || st.GetLeader() {
			return fmt.Errorf("%s: leader %v (%v)", m.ID, st.GetLeader(), err)
		}
		return nil
	})
	if err != nil {
		s.t.Fatal(err)
	}
}

// metric returns the value of an unlabelled metric that member m exposes.
func (s *scenario) metric(m *kvcluster.Member, name string) float64 {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	hc, scheme := http.DefaultClient, "http"
	if src := s.cluster.TLS(); src != nil {
		// Any identity of the CA serves metrics: assigners and distributors alike.
		hc, scheme = &http.Client{Transport: &http.Transport{TLSClientConfig: src.ClientTLS()}}, "https"
		defer hc.CloseIdleConnections()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+m.Metrics+"/metrics", nil)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				s.t.Fatalf("%s: %q: %v", m.ID, line, err)
			}
			return f
		}
	}
	s.t.Fatalf("%s exposes no %s", m.ID, name)
	return 0
}
