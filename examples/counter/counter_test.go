// Package counter_test runs the example counter in one process: an assigner with primary
// and secondary roles, three members on a throwaway PostgreSQL, the proxy and the load; it
// restarts every member in turn and moves primaries under increments, then checks the
// history as a counter's (countercheck).
package counter_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/counter/countercheck"
	"github.com/sliceplane/sliceplane/examples/counter/counterload"
	"github.com/sliceplane/sliceplane/examples/counter/countermember"
	"github.com/sliceplane/sliceplane/examples/counter/counterproxy"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/logging/logtest"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
)

// member is a running countermember and how to stop it.
type member struct {
	id   string
	stop context.CancelFunc
	done chan error
}

// logs collects the members' role changes (their applications' debug logs), for the report
// of a failed check.
var logs logtest.Buffer

func startMember(t *testing.T, c *clustertest.Cluster, dsn, id string) *member {
	t.Helper()
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := countermember.New(t.Context(), countermember.Config{ID: id, Listen: "127.0.0.1:0", Assigners: c.Assigners(), DSN: dsn,
		DrainTimeout: 90 * time.Second, ReportInterval: 200 * time.Millisecond, WriteDelay: 10 * time.Millisecond, Logger: log})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{id: id, stop: cancel, done: make(chan error, 1)}
	go func() { m.done <- srv.Run(ctx) }()
	return m
}

// halt stops m (it drains first) and waits until it has.
func (m *member) halt(t *testing.T) {
	t.Helper()
	m.stop()
	select {
	case err := <-m.done:
		require.NoError(t, err, "member %s", m.id)
	case <-time.After(150 * time.Second): // a drain of 90 s at most, then the stop
		t.Fatalf("member %s did not stop", m.id)
	}
}

// TestCounterUnderRollingRestartAndPrimaryMoves is the counter check of the example under a
// rolling restart of every member and operator moves of primaries (COUNTER_SECONDS of load
// after the faults, default 2).
func TestCounterUnderRollingRestartAndPrimaryMoves(t *testing.T) {
	logs.Reset()
	pg := pgtest.Start(t)
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		cfg.Core.Roles = core.RolesPrimarySecondary
		cfg.Core.HandoffTimeout, cfg.Core.HandoffLinger = 20*time.Second, 300*time.Millisecond
		cfg.Core.Exclusive = true
	}})
	members := map[string]*member{}
	for _, id := range []string{"c1", "c2", "c3"} {
		members[id] = startMember(t, c, pg.DSN, id)
	}
	t.Cleanup(func() {
		for _, m := range members {
			m.stop()
			<-m.done
		}
	})
	r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), Policy: client.LeastOutstanding})
	require.NoError(t, err)
	rctx, stopRouter := context.WithCancel(context.Background())
	routed := make(chan struct{})
	go func() { defer close(routed); r.Run(rctx) }() //nolint:errcheck // nil when rctx ends
	t.Cleanup(func() { stopRouter(); <-routed })
	proxy := httptest.NewServer(counterproxy.New(r, nil, "http"))
	t.Cleanup(proxy.Close)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	require.NoError(t, r.WaitReady(ctx))
	history := countercheck.NewHistory()
	load := counterload.New(counterload.Config{URL: proxy.URL, Client: &http.Client{}, Keys: 50, Rate: 200}, history)
	lctx, stopLoad := context.WithCancel(ctx)
	loaded := make(chan struct{})
	go func() { defer close(loaded); load.Run(lctx) }()

	waitAcked(t, load, 200)
	for _, id := range []string{"c1", "c2", "c3"} { // a rolling restart
		members[id].halt(t)
		members[id] = startMember(t, c, pg.DSN, id)
		waitAcked(t, load, 100)
	}
	movePrimaries(ctx, t, c)
	seconds := 2
	if s, err := strconv.Atoi(os.Getenv("COUNTER_SECONDS")); err == nil && s > 0 {
		seconds = s
	}
	waitAcked(t, load, int64(seconds)*150)
	stopLoad()
	<-loaded

	pool, err := pgxpool.New(ctx, pg.DSN)
	require.NoError(t, err)
	defer pool.Close()
	stored, err := countermember.Stored(ctx, pool)
	require.NoError(t, err)
	res := history.Check(stored)
	t.Logf("counter: %s excused=%d lost=%d", res, res.Excused, res.Lost)
	if !res.OK() || res.Failed > 0 {
		t.Logf("duplicates:\n%s", strings.Join(history.Duplicates(), "\n"))
		t.Logf("the members' role changes:\n%s", logs.String())
	}
	require.True(t, res.OK(), "%s excused=%d lost=%d", res, res.Excused, res.Lost)
	require.Zero(t, res.Failed, "every increment answered")
	require.Greater(t, res.Acked, int64(500))
}

// waitAcked waits until n more increments were sent.
func waitAcked(t *testing.T, load *counterload.Load, n int64) {
	t.Helper()
	sent, _ := load.Counts()
	deadline := time.Now().Add(time.Minute)
	for s, _ := load.Counts(); s < sent+n; s, _ = load.Counts() {
		if time.Now().After(deadline) {
			t.Fatalf("%d increments sent in a minute, want %d", s-sent, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// movePrimaries moves three slices of c1 to c2, one at a time, each once its previous move
// is done.
func movePrimaries(ctx context.Context, t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	adm, assignments := pb.NewAdminServiceClient(c.Conn()), pb.NewAssignmentServiceClient(c.Conn())
	list, err := adm.ListSlices(ctx, &pb.ListSlicesRequest{Node: "c1"}, grpc.WaitForReady(true))
	require.NoError(t, err)
	for i, sl := range list.GetSlices() {
		if i == 3 {
			break
		}
		start := sl.GetRange().GetStart()
		_, err := adm.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Hash{Hash: start}}, To: []string{"c2"}})
		if err != nil {
			t.Logf("move %d: %v (a pass moved it first)", i, err)
			continue
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			l, err := assignments.Lookup(ctx, &pb.LookupRequest{Target: &pb.LookupRequest_Hash{Hash: start}})
			if err == nil && l.GetPrimary() != "" && l.GetNext() == "" && len(l.GetReplicas()) == 1 {
				break
			}
			require.True(t, time.Now().Before(deadline), fmt.Sprintf("slice %d's move did not finish", i))
			time.Sleep(20 * time.Millisecond)
		}
	}
}
