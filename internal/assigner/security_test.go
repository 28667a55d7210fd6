package assigner_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	storev1 "github.com/sliceplane/sliceplane/api/sliceplane/store/v1"
	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/authz/authztest"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/logging/logtest"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// logBuffer collects an assigner's JSON logs while the test reads them.
type logBuffer struct{ logtest.Buffer }

// records returns the log records whose message is msg.
func (b *logBuffer) records(msg string) []map[string]any {
	var out []map[string]any
	dec := json.NewDecoder(strings.NewReader(b.String()))
	for dec.More() {
		var r map[string]any
		if dec.Decode(&r) != nil {
			break
		}
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// secured is an assigner serving mutual TLS with certificates of pki, its clients dialing
// as the admin "harness".
type secured struct {
	*node
	c   *cluster
	pki *mtlstest.PKI
	log *logBuffer
}

func startSecured(t *testing.T, tweaks ...tweak) *secured {
	t.Helper()
	pki := mtlstest.New(t)
	logs := &logBuffer{}
	src := pki.Source("assigner", "a1")
	tweaks = append([]tweak{func(cfg *assigner.Config) {
		cfg.TLS = src
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}}, tweaks...)
	c := newCluster(t)
	n := c.startAs(pki.Source("admin", "harness").DialOption("assigner"), tweaks...)
	return &secured{node: n, c: c, pki: pki, log: logs}
}

// as returns a connection to s with the certificate of kind/name.
func (s *secured) as(t *testing.T, kind, name string) *grpc.ClientConn {
	t.Helper()
	return dialAssigner(t, s.srv.Addr(), s.pki.Source(kind, name).DialOption("assigner"))
}

func dialAssigner(t *testing.T, addr string, creds grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, creds)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// denied returns sliceplane_assigner_requests_denied_total{method,reason}.
func (s *secured) denied(t *testing.T, method, reason string) float64 {
	t.Helper()
	return authztest.Denied(t, s.registry, "assigner", method)[reason]
}

func register(id, addr string) *pb.RegisterRequest {
	return &pb.RegisterRequest{Node: &pb.Node{Id: id}, Address: addr}
}

func TestEveryCallerGetsWhatItsRoleAllowsAndNothingElse(t *testing.T) {
	s := startSecured(t)
	s.leading(t)
	ctx := ctxT(t, 60*time.Second)

	n1 := s.as(t, "node", "n1")
	n2 := s.as(t, "node", "n2")
	_, err := pb.NewNodeServiceClient(n2).Register(ctx, register("n2", "127.0.0.1:2"))
	require.NoError(t, err)
	nodes := pb.NewNodeServiceClient(n1)
	_, err = nodes.Register(ctx, register("n1", "127.0.0.1:1"))
	require.NoError(t, err, "node n1 registers as n1")
	_, err = nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n1"})
	require.NoError(t, err, "node n1 heartbeats as n1")
	eventually(t, 10*time.Second, "a map exists", s.hasMap)
	_, err = nodes.ReportLoad(ctx, wire.ReportToProto(load.Report{Node: "n1", Window: time.Second,
		Samples: []load.Sample{{Range: keyspace.Full(), Load: 1}}}))
	require.NoError(t, err, "node n1 reports its load")

	const (
		mRegister   = "/sliceplane.v1.NodeService/Register"
		mHeartbeat  = "/sliceplane.v1.NodeService/Heartbeat"
		mReportLoad = "/sliceplane.v1.NodeService/ReportLoad"
		mDrain      = "/sliceplane.v1.AdminService/Drain"
		impersonate = authz.ReasonImpersonation
	)
	// A node acting as another.
	_, err = nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "n2"}, Address: "127.0.0.1:9"})
	assert.Equal(t, codes.PermissionDenied, code(err), "n1 registers as n2: %v", err)
	_, err = nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n2"})
	assert.Equal(t, codes.PermissionDenied, code(err), "n1 heartbeats as n2: %v", err)
	_, err = nodes.ReportLoad(ctx, &pb.ReportLoadRequest{NodeId: "n2"})
	assert.Equal(t, codes.PermissionDenied, code(err), "n1 reports n2's load: %v", err)
	assert.Equal(t, 1.0, s.denied(t, mRegister, impersonate))
	assert.Equal(t, 1.0, s.denied(t, mHeartbeat, impersonate))
	assert.Equal(t, 1.0, s.denied(t, mReportLoad, impersonate))
	// A node drains itself on shutdown, and only itself.
	_, err = nodes.Drain(ctx, &pb.NodeServiceDrainRequest{NodeId: "n2"})
	assert.Equal(t, codes.PermissionDenied, code(err), "n1 drains n2: %v", err)
	assert.Equal(t, 1.0, s.denied(t, "/sliceplane.v1.NodeService/Drain", impersonate))
	_, err = nodes.Drain(ctx, &pb.NodeServiceDrainRequest{NodeId: "n1"})
	require.NoError(t, err, "node n1 drains itself")
	_, err = nodes.Drain(ctx, &pb.NodeServiceDrainRequest{NodeId: "n1", Cancel: true})
	require.NoError(t, err, "node n1 stops draining itself")

	// Admin calls need the admin role.
	_, err = pb.NewAdminServiceClient(n1).Drain(ctx, &pb.DrainRequest{NodeId: "n2"})
	assert.Equal(t, codes.PermissionDenied, code(err), "a node drains: %v", err)
	viewer := pb.NewAdminServiceClient(s.as(t, "viewer", "vera"))
	_, err = viewer.Drain(ctx, &pb.DrainRequest{NodeId: "n2"})
	assert.Equal(t, codes.PermissionDenied, code(err), "a viewer drains: %v", err)
	assert.Equal(t, 2.0, s.denied(t, mDrain, authz.ReasonRole))
	st, err := viewer.Status(ctx, &pb.StatusRequest{})
	require.NoError(t, err, "a viewer reads the status")
	assert.True(t, st.GetLeader())
	_, err = pb.NewAdminServiceClient(s.as(t, "admin", "alice")).Drain(ctx, &pb.DrainRequest{NodeId: "n2"})
	require.NoError(t, err, "an admin drains")

	// Routers read the map, distributors the quanta; neither reports load.
	router := s.as(t, "router", "r1")
	w, err := pb.NewAssignmentServiceClient(router).WatchAssignment(ctx, &pb.WatchAssignmentRequest{})
	require.NoError(t, err)
	first, err := recv(w)
	require.NoError(t, err, "a router watches the map")
	assert.True(t, first.GetQuantum().GetReinitializing())
	_, err = pb.NewNodeServiceClient(router).ReportLoad(ctx, &pb.ReportLoadRequest{NodeId: "n1"})
	assert.Equal(t, codes.PermissionDenied, code(err), "a router reports load: %v", err)
	assert.Equal(t, 1.0, s.denied(t, mReportLoad, authz.ReasonRole))
	q, err := pb.NewQuantaServiceClient(s.as(t, "distributor", "d1")).WatchQuanta(ctx, &pb.WatchQuantaRequest{})
	require.NoError(t, err)
	fq, err := recv(q)
	require.NoError(t, err, "a distributor watches the quanta")
	assert.True(t, fq.GetQuantum().GetReinitializing())

	assertUnauthenticated(t, s, ctx)
}

// assertUnauthenticated checks that callers without a valid identity are not let in at all.
func assertUnauthenticated(t *testing.T, s *secured, ctx context.Context) {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(s.pki.Dir, "ca.crt"))
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))
	noCert := credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12})
	other := mtlstest.New(t).Config("admin", "eve")
	untrusted, err := mtls.Config{Cert: other.Cert, Key: other.Key, CA: filepath.Join(s.pki.Dir, "ca.crt")}.Load()
	require.NoError(t, err)
	expired, err := s.pki.Issue(certs.Request{Kind: "admin", Name: "old",
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}).Load()
	require.NoError(t, err)
	for _, c := range []struct {
		name  string
		creds grpc.DialOption
	}{
		{"no certificate", grpc.WithTransportCredentials(noCert)},
		{"a certificate from another CA", untrusted.DialOption("assigner")},
		{"an expired certificate", expired.DialOption("assigner")},
	} {
		_, err := pb.NewAdminServiceClient(dialAssigner(t, s.srv.Addr(), c.creds)).Status(ctx, &pb.StatusRequest{})
		assert.Equal(t, codes.Unauthenticated, code(err), "%s: %v", c.name, err)
	}
	assert.Equal(t, 3.0, s.denied(t, "/sliceplane.v1.AdminService/Status", authz.ReasonUnauthenticated))
}

func TestEveryMethodServedHasARule(t *testing.T) {
	s := startSecured(t)
	rules := authz.AssignerRules()
	methods := assigner.Methods(s.srv)
	require.NotEmpty(t, methods)
	for _, m := range methods {
		svc := m[:strings.LastIndex(m, "/")]
		_, exact := rules[m]
		_, whole := rules[svc+"/*"]
		assert.True(t, exact || whole, "%s has no authz rule: it would be refused to everyone", m)
	}
	for name := range rules {
		if strings.HasSuffix(name, "/*") {
			continue
		}
		assert.Contains(t, methods, name, "the rule of %s names a method the assigner does not serve", name)
	}
}

func TestTheAuditTrailNamesTheAuthenticatedCaller(t *testing.T) {
	s := startSecured(t)
	s.leading(t)
	ctx := ctxT(t, 60*time.Second)
	for _, id := range []string{"n1", "n2"} {
		_, err := pb.NewNodeServiceClient(s.as(t, "node", id)).Register(ctx, register(id, "127.0.0.1:1"))
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, "a map exists", s.hasMap)

	const alice = "spiffe://sliceplane/admin/alice"
	admin := pb.NewAdminServiceClient(s.as(t, "admin", "alice"))
	// What the client claims to be is logged beside the identity, never instead of it.
	claimed := metadata.AppendToOutgoingContext(ctx, assigner.UserMetadata, "mallory")
	_, err := admin.Freeze(claimed, &pb.FreezeRequest{Reason: "maintenance"})
	require.NoError(t, err)
	_, err = admin.Drain(claimed, &pb.DrainRequest{NodeId: "n2"})
	require.NoError(t, err)
	split, err := admin.Split(ctx, &pb.SplitRequest{At: &pb.SplitRequest_AtHash{AtHash: 0x4000_0000_0000_1234}})
	require.NoError(t, err)

	viewer := pb.NewAdminServiceClient(s.as(t, "viewer", "vera"))
	history := func() []*pb.Quantum {
		resp, err := viewer.ListQuanta(ctx, &pb.ListQuantaRequest{})
		require.NoError(t, err)
		return resp.GetQuanta()
	}
	by := map[string]string{}
	for _, q := range history() {
		by[q.GetCause()] = q.GetBy()
	}
	assert.Equal(t, alice, by[`admin: freeze balancing: "maintenance"`], "the freeze, without map ops, is in the history: %v", by)
	causes := slices.Collect(maps.Keys(by))
	drained := slices.IndexFunc(causes, func(c string) bool { return strings.HasPrefix(c, "admin: drain n2") })
	require.GreaterOrEqual(t, drained, 0, "the drain is in the history: %v", by)
	assert.Equal(t, alice, by[causes[drained]])
	assert.Equal(t, alice, by["admin: "+split.GetChange().GetSummary()], "the split too: %v", by)
	assert.Equal(t, "spiffe://sliceplane/node/n1", by[`node: node n1 registered at "127.0.0.1:1"`], "%v", by)
	initial, ok := by["initial"]
	assert.True(t, ok && initial == "", "the assigner's own quanta name nobody: %v", by)

	// Re-registering unchanged, as nodes do after a failover, adds nothing; a change does.
	registrations := func() int {
		n := 0
		for _, q := range history() {
			if strings.HasPrefix(q.GetCause(), "node: node n1 registered") {
				n++
			}
		}
		return n
	}
	n1 := pb.NewNodeServiceClient(s.as(t, "node", "n1"))
	_, err = n1.Register(ctx, register("n1", "127.0.0.1:1"))
	require.NoError(t, err)
	assert.Equal(t, 1, registrations(), "a renewal is not history")
	_, err = n1.Register(ctx, register("n1", "127.0.0.1:11"))
	require.NoError(t, err)
	assert.Equal(t, 2, registrations(), "a new address is")

	// The log says the same, with what the client claimed beside it.
	var freeze map[string]any
	for _, r := range s.log.records("audit") {
		if r["method"] == "freeze" {
			freeze = r
		}
	}
	require.NotNil(t, freeze, "the freeze is logged")
	assert.Equal(t, alice, freeze["by"])
	assert.Equal(t, "mallory", freeze["claims"])
	assert.Equal(t, "ok", freeze["result"])
	assert.Contains(t, freeze["what"], "freeze balancing")

	// The split's log entry in etcd names alice too.
	assert.Equal(t, alice, loggedBy(t, s, split.GetChange().GetPosition().GetSeq()))
}

// loggedBy returns the by of the stored log entry of the quantum at seq.
func loggedBy(t *testing.T, s *secured, seq uint64) string {
	t.Helper()
	resp, err := s.c.cli.Get(ctxT(t, 10*time.Second), "/sliceplane/assigner/log/", clientv3.WithPrefix())
	require.NoError(t, err)
	for _, kv := range resp.Kvs {
		var v storev1.Value
		require.NoError(t, proto.Unmarshal(kv.Value, &v))
		var e storev1.LogEntry
		if proto.Unmarshal(v.GetInline(), &e) == nil && e.GetSeq() == seq {
			return e.GetBy()
		}
	}
	t.Fatalf("no log entry of seq %d", seq)
	return ""
}

func TestANetworkAddressWithoutTLSIsRefusedUnlessInsecure(t *testing.T) {
	c := newCluster(t)
	_, err := assigner.New(assigner.Config{Client: c.cli, Listen: "0.0.0.0:0", Logger: testLogger()})
	require.Error(t, err)
	assert.ErrorIs(t, err, mtls.ErrConfig)
	assert.Contains(t, err.Error(), "refusing to serve the assigner's gRPC API on 0.0.0.0:0 without TLS")
	_, err = assigner.New(assigner.Config{Client: c.cli, MetricsListen: "0.0.0.0:0", Logger: testLogger()})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refusing to serve the assigner's metrics on 0.0.0.0:0 without TLS")

	logs := &logBuffer{}
	srv, err := assigner.New(assigner.Config{Client: c.cli, Listen: "0.0.0.0:0", Insecure: true,
		SessionTTL: time.Second, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	require.NoError(t, err, "--insecure allows it")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	eventually(t, 10*time.Second, "the warning", func() bool {
		for _, r := range logs.records("serving WITHOUT TLS on a network address (--insecure): anyone who reaches it can call it") {
			if r["endpoint"] == "grpc" {
				return true
			}
		}
		return false
	})
	cancel()
	require.NoError(t, <-done)
}

func TestMetricsNeedAClientCertificateUnderTLS(t *testing.T) {
	s := startSecured(t, func(cfg *assigner.Config) { cfg.MetricsListen = "127.0.0.1:0" })
	url := "https://" + s.srv.MetricsAddr() + "/metrics"
	get := func(conf *tls.Config) (string, error) {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
		defer c.CloseIdleConnections()
		resp, err := c.Get(url)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return string(body), err
	}
	body, err := get(s.pki.Source("viewer", "prometheus").ClientTLS("assigner"))
	require.NoError(t, err)
	assert.Contains(t, body, "sliceplane_assigner_leader")
	caPEM, err := os.ReadFile(filepath.Join(s.pki.Dir, "ca.crt"))
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))
	_, err = get(&tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12})
	assert.Error(t, err, "a scraper without a certificate")
}

// TestOnlyAnAdminLiftsAQuarantine checks that Unquarantine sits behind the admin role, and
// that an admin's lift of what is not quarantined succeeds and changes nothing.
func TestOnlyAnAdminLiftsAQuarantine(t *testing.T) {
	s := startSecured(t)
	s.leading(t)
	ctx := ctxT(t, 60*time.Second)
	_, err := pb.NewNodeServiceClient(s.as(t, "node", "n1")).Register(ctx, register("n1", "127.0.0.1:1"))
	require.NoError(t, err)
	eventually(t, 10*time.Second, "a map exists", s.hasMap)
	req := &pb.UnquarantineRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: []byte("k")}}}
	for _, who := range [][2]string{{"viewer", "vera"}, {"node", "n1"}, {"router", "r1"}} {
		_, err := pb.NewAdminServiceClient(s.as(t, who[0], who[1])).Unquarantine(ctx, req)
		assert.Equal(t, codes.PermissionDenied, code(err), "a %s lifts a quarantine: %v", who[0], err)
	}
	assert.Equal(t, 3.0, s.denied(t, "/sliceplane.v1.AdminService/Unquarantine", authz.ReasonRole))
	resp, err := pb.NewAdminServiceClient(s.as(t, "admin", "alice")).Unquarantine(ctx, req)
	require.NoError(t, err, "an admin lifts a quarantine")
	assert.True(t, resp.GetAlready(), "nothing was quarantined")
}
