package assigner_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/authz"
)

// page is a client of an assigner's web view.
type page struct {
	t    *testing.T
	base string
	http *http.Client
}

func newPage(t *testing.T, addr string, conf *tls.Config) *page {
	scheme := "http"
	if conf != nil {
		scheme = "https"
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return &page{t: t, base: scheme + "://" + addr + "/ui/", http: c}
}

// get fetches path into out (when not nil) and returns the status code.
func (p *page) get(path string, out any) (int, error) {
	resp, err := p.http.Get(p.base + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

type viewState struct {
	Leader bool `json:"leader"`
	Nodes  []struct {
		Node struct {
			ID string `json:"id"`
		} `json:"node"`
	} `json:"nodes"`
	NodeStates map[string]string `json:"nodeStates"`
	Quanta     []viewQuantum     `json:"quanta"`
	Passes     []json.RawMessage `json:"passes"`
	History    struct {
		First     uint64    `json:"first"`
		Last      uint64    `json:"last"`
		FirstTime time.Time `json:"firstTime"`
		Columns   int       `json:"columns"`
	} `json:"history"`
}

type viewGrid struct {
	Seqs   []uint64    `json:"seqs"`
	Holder []int       `json:"holder"`
	Nodes  []string    `json:"nodes"`
	Events []viewEvent `json:"events"`
}

type viewQuantum struct {
	Cause string `json:"cause"`
	By    string `json:"by"`
}

type viewEvent struct {
	Kind  string `json:"kind"`
	Cause string `json:"cause"`
}

func (p *page) state() viewState {
	var st viewState
	code, err := p.get("api/state", &st)
	require.NoError(p.t, err)
	require.Equal(p.t, http.StatusOK, code)
	return st
}

func (p *page) grid(query string) viewGrid {
	var g viewGrid
	code, err := p.get("api/heatmap?"+query, &g)
	require.NoError(p.t, err)
	require.Equal(p.t, http.StatusOK, code)
	return g
}

// TestTheWebViewShowsTheClusterToViewersOnly: a viewer gets the page, the state and a
// heatmap of the map; a move shows in the feed, on the heatmap and on the event stream
// within 2 s; a node's certificate gets a 403 (counted), and no certificate no page.
func TestTheWebViewShowsTheClusterToViewersOnly(t *testing.T) {
	s := startSecured(t, func(cfg *assigner.Config) {
		cfg.MetricsListen = "127.0.0.1:0"
		cfg.Core.NodeTTL = time.Minute // the nodes register once and send no heartbeat
	})
	s.leading(t)
	ctx := ctxT(t, 60*time.Second)
	for _, id := range []string{"n1", "n2"} {
		_, err := pb.NewNodeServiceClient(s.as(t, "node", id)).Register(ctx, register(id, "127.0.0.1:1"))
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, "a map exists", s.hasMap)
	viewer := newPage(t, s.srv.MetricsAddr(), s.pki.Source("viewer", "vera").ClientTLS("assigner"))
	code, err := viewer.get("", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "the page")
	st := viewer.state()
	require.True(t, st.Leader)
	require.Len(t, st.Nodes, 2)
	assert.Equal(t, map[string]string{"n1": "serving", "n2": "serving"}, st.NodeStates)
	eventually(t, 10*time.Second, "the heatmap draws the map", func() bool {
		g := viewer.grid("w=4&h=16")
		return len(g.Nodes) == 2 && g.Holder[len(g.Holder)-1] >= 0
	})

	events := viewer.stream(ctx)
	<-events // the stream says where it starts
	moved := s.assignment(t).Slice(0)
	to := "n1"
	if moved.Holds("n1") {
		to = "n2"
	}
	asked := time.Now()
	_, err = s.admin.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Start{Start: moved.Range.Start}}, To: []string{to}})
	require.NoError(t, err)
	select {
	case <-events:
	case <-time.After(2 * time.Second):
		t.Fatal("no update on the event stream within 2 s of a move")
	}
	// Passes run every 50 ms here: the move need not be the newest change.
	st = viewer.state()
	i := slices.IndexFunc(st.Quanta, func(q viewQuantum) bool { return strings.HasPrefix(q.Cause, "admin: move ") })
	require.GreaterOrEqual(t, i, 0, "the move in the feed: %+v", st.Quanta)
	assert.Equal(t, "spiffe://sliceplane/admin/harness", st.Quanta[i].By, "who made it")
	g := viewer.grid("w=4&h=16")
	assert.True(t, slices.ContainsFunc(g.Events, func(e viewEvent) bool {
		return e.Kind == "move" && strings.HasPrefix(e.Cause, "admin: move ")
	}), "the move on the heatmap: %+v", g.Events)
	assert.Less(t, time.Since(asked), 2*time.Second, "the move was on the page within 2 s")

	node := newPage(t, s.srv.MetricsAddr(), s.pki.Source("node", "n1").ClientTLS("assigner"))
	code, err = node.get("api/state", nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code, "a node is no viewer")
	assert.Equal(t, 1.0, s.denied(t, "/ui/", authz.ReasonRole))
	_, err = newPage(t, s.srv.MetricsAddr(), &tls.Config{InsecureSkipVerify: true}).get("", nil) //nolint:gosec // the client's certificate is what is missing
	assert.Error(t, err, "no certificate, no page")
}

// stream opens the event stream and sends on the channel at each update it reads.
func (p *page) stream(ctx context.Context) <-chan struct{} {
	ctx, cancel := context.WithCancel(ctx)
	p.t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"api/events", nil)
	require.NoError(p.t, err)
	c := &http.Client{Transport: p.http.Transport} // no timeout: the stream lives on
	resp, err := c.Do(req)
	require.NoError(p.t, err)
	require.Equal(p.t, "text/event-stream", resp.Header.Get("Content-Type"))
	out := make(chan struct{}, 100)
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "event: update") {
				out <- struct{}{}
			}
		}
	}()
	return out
}

// TestTheHistorySurvivesAFailover: the new leader restores the history its predecessor
// persisted, from its first column on, and goes on after it.
func TestTheHistorySurvivesAFailover(t *testing.T) {
	c := newCluster(t)
	c.preRegister(t, fleetIDs(3), "")
	fast := func(cfg *assigner.Config) {
		cfg.MetricsListen, cfg.HistoryFlush = "127.0.0.1:0", 100*time.Millisecond
	}
	a := c.start(small, fast)
	a.leading(t)
	b := c.start(small, fast)
	a, others := owner(t, a, b)
	b = others[0]
	startFleet(t, hot, 3, a, b)
	pa, pb := newPage(t, a.srv.MetricsAddr(), nil), newPage(t, b.srv.MetricsAddr(), nil)
	eventually(t, 20*time.Second, "a's history holds a few flushes", func() bool { return pa.state().History.Last > 30 })
	code, err := pb.get("api/heatmap", nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, code, "a standby has no history to show")
	before := pa.state().History
	a.stop()
	b.leading(t)
	after := pb.state().History
	assert.Equal(t, before.FirstTime, after.FirstTime, "the new leader's history starts where the old one's did")
	assert.Equal(t, before.First, after.First)
	assert.GreaterOrEqual(t, after.Last+10, before.Last, "at most what a flush holds is lost")
	g := pb.grid("w=8&h=8&to=" + "20")
	assert.GreaterOrEqual(t, g.Holder[0], 0, "the restored columns draw the old leader's map")
}
