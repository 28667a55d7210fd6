package assignermain

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/flagfile"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHelpExplainsEveryFlag(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	require.NoError(t, cmd.Execute())
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		assert.Contains(t, out.String(), "--"+f.Name, "the help lists --%s", f.Name)
		assert.NotEmpty(t, f.Usage, "--%s has a description", f.Name)
	})
	assert.Contains(t, out.String(), "embedded etcd")
}

// freePort returns a loopback address that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func TestZeroSetupRunsAndStopsCleanly(t *testing.T) {
	dir := t.TempDir()
	listen := freePort(t)
	config := filepath.Join(dir, "assigner.yaml")
	require.NoError(t, os.WriteFile(config, []byte(strings.Join([]string{
		"listen: " + listen,
		"metrics-listen: " + freePort(t),
		"embedded-etcd-listen: " + freePort(t),
		"data-dir: " + filepath.Join(dir, "data"),
		"session-ttl: 1s",
		"log-level: warn",
		"param: [max_churn=0.05]",
	}, "\n")), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	cmd := NewCommand()
	cmd.SetArgs([]string{"--config", config})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	conn, err := grpc.NewClient(listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	admin := pb.NewAdminServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := admin.Status(ctx, &pb.StatusRequest{})
		if err == nil && st.GetLeader() {
			assert.Equal(t, "0.05", st.GetParams()["max_churn"], "flags from the config file apply")
			break
		}
		require.True(t, time.Now().Before(deadline), "not leading within 30s: %v", err)
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err, "a cancelled run is a clean stop")
	case <-time.After(30 * time.Second):
		t.Fatal("did not stop")
	}
	_, err = os.Stat(filepath.Join(dir, "data", "member"))
	assert.NoError(t, err, "the embedded etcd kept its data in --data-dir")
}

func TestBadSettingsAreRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"--log-format", "xml"}, `--log-format "xml"`},
		{[]string{"--param", "nonsense"}, "is not name=value"},
		{[]string{"--config", "/does/not/exist.yaml"}, "no such file"},
		{[]string{"stray"}, "unknown command"},
		{[]string{"--algorithm", "magic"}, "unknown algorithm"},
		{[]string{"--param", "max_churn=7"}, "max_churn=7: want 0..1"},
		{[]string{"--max-load-rate", "-1"}, "max load rate -1"},
		{[]string{"--max-load-rate", "+Inf"}, "max load rate +Inf"},
		{[]string{"--param", "dead_band=1e308"}, "dead_band=1e+308: want 0..10"},
		{[]string{"--zone-label", strings.Repeat("z", 64)}, "zone label"},
		{[]string{"--load-forecast", "magic"}, `--load-forecast "magic": want one of ewma, peak, holt, adaptive`},
		{[]string{"--load-half-life", "-1s"}, "--load-half-life -1s"},
		{[]string{"--load-signal-half-life", "-2s"}, "--load-signal-half-life -2s"},
		{[]string{"--handoff-timeout", "-1s"}, "handoff timeout -1s"},
		{[]string{"--handoff-linger", "-1s"}, "handoff linger -1s"},
		{[]string{"--history", "1s"}, "--history 1s: the heatmap keeps at least two passes"},
		{[]string{"--history-cells", "3"}, "--history-cells 3: want a power of two"},
		{[]string{"--max-reports-per-second", "0"}, "--max-reports-per-second 0: want more than 0"},
	} {
		cmd := NewCommand()
		cmd.SetArgs(c.args)
		cmd.SetErr(&bytes.Buffer{})
		err := cmd.ExecuteContext(context.Background())
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.want, "%v", c.args)
	}
}

func TestEstimatorSettingsFromTheConfigFile(t *testing.T) {
	config := filepath.Join(t.TempDir(), "assigner.yaml")
	require.NoError(t, os.WriteFile(config, []byte("load-forecast: crystal-ball\nload-peak-half-life: 2s\n"), 0o644))
	cmd := NewCommand()
	cmd.SetArgs([]string{"--config", config})
	cmd.SetErr(&bytes.Buffer{})
	err := cmd.ExecuteContext(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), `forecast "crystal-ball"`, "the config file's keys reach the estimator")
}

func TestMutualTLSFromTheConfigFile(t *testing.T) {
	dir := t.TempDir()
	pki := mtlstest.New(t)
	own := pki.Config("assigner", "a1")
	policy := filepath.Join(dir, "policy.yaml")
	require.NoError(t, os.WriteFile(policy, []byte("grants:\n  spiffe://sliceplane/router/*: [viewer]\n"), 0o644))
	listen, etcdAddr := freePort(t), freePort(t)
	config := filepath.Join(dir, "assigner.yaml")
	require.NoError(t, os.WriteFile(config, []byte(strings.Join([]string{
		"listen: " + listen,
		"metrics-listen: " + freePort(t),
		"embedded-etcd-listen: " + etcdAddr,
		"data-dir: " + filepath.Join(dir, "data"),
		"session-ttl: 1s",
		"log-level: warn",
		"tls-cert: " + own.Cert,
		"tls-key: " + own.Key,
		"tls-ca: " + own.CA,
		"authz-policy: " + policy,
	}, "\n")), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := NewCommand()
	cmd.SetArgs([]string{"--config", config})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	// A router may read the status only by the policy's grant.
	conn, err := grpc.NewClient(listen, pki.Source("router", "r1").DialOption("assigner"))
	require.NoError(t, err)
	defer conn.Close()
	admin := pb.NewAdminServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := admin.Status(ctx, &pb.StatusRequest{})
		if err == nil && st.GetLeader() {
			break
		}
		require.NotEqual(t, codes.PermissionDenied, status.Code(err), "the policy grants routers the viewer role: %v", err)
		require.True(t, time.Now().Before(deadline), "not leading within 30s: %v", err)
		time.Sleep(20 * time.Millisecond)
	}
	_, err = admin.Freeze(ctx, &pb.FreezeRequest{})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "but not the admin role: %v", err)
	plain, err := grpc.NewClient(listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	_, err = pb.NewAdminServiceClient(plain).Status(ctx, &pb.StatusRequest{})
	assert.Error(t, err, "a plaintext client")

	// The embedded etcd speaks https to certificate holders only.
	put := func(endpoint string, conf *tls.Config, wait time.Duration) error {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: wait, TLS: conf, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer c.Close()
		pctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		_, err = c.Put(pctx, "/elsewhere/k", "v")
		return err
	}
	assert.Error(t, put("https://"+etcdAddr, nil, 2*time.Second), "an etcd client without TLS")
	assert.Error(t, put("http://"+etcdAddr, nil, 2*time.Second), "a plaintext etcd client")
	assert.NoError(t, put("https://"+etcdAddr, pki.Source("distributor", "d1").ClientTLS(), 20*time.Second), "a distributor's certificate")

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err, "a cancelled run is a clean stop")
	case <-time.After(30 * time.Second):
		t.Fatal("did not stop")
	}
}

func TestBadSecuritySettingsAreRefusedBeforeAnythingStarts(t *testing.T) {
	dir := t.TempDir()
	pki := mtlstest.New(t)
	c := pki.Config("assigner", "a1")
	badPolicy := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(badPolicy, []byte("grants:\n  spiffe://sliceplane/node/n1: [superuser]\n"), 0o644))
	goodPolicy := filepath.Join(dir, "good.yaml")
	require.NoError(t, os.WriteFile(goodPolicy, []byte("grants:\n  spiffe://sliceplane/node/n1: [viewer]\n"), 0o644))
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o644))
	tlsFlags := []string{"--tls-cert", c.Cert, "--tls-key", c.Key, "--tls-ca", c.CA}
	data := filepath.Join(dir, "data")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", c.Cert}, "--tls-key, --tls-ca missing"},
		{[]string{"--tls-cert", c.Cert, "--tls-key", c.Key}, "--tls-ca missing"},
		{[]string{"--tls-cert", "/no/such.crt", "--tls-key", c.Key, "--tls-ca", c.CA}, "--tls-cert: stat /no/such.crt"},
		{[]string{"--tls-cert", c.Cert, "--tls-key", c.Key, "--tls-ca", "/no/ca.crt"}, "--tls-ca: stat /no/ca.crt"},
		{[]string{"--tls-cert", c.Cert, "--tls-key", c.Key, "--tls-ca", notPEM}, "holds no PEM certificate"},
		{append([]string{"--insecure"}, tlsFlags...), "--insecure goes with no TLS files"},
		{append([]string{"--authz-policy", badPolicy}, tlsFlags...), `--authz-policy: ` + badPolicy + `: authz: bad policy: "spiffe://sliceplane/node/n1": unknown role "superuser"`},
		{append([]string{"--authz-policy", "/no/policy.yaml"}, tlsFlags...), "--authz-policy: authz: bad policy: open /no/policy.yaml"},
		{[]string{"--authz-policy", goodPolicy}, "--authz-policy needs --tls-cert, --tls-key and --tls-ca"},
		{append([]string{"--etcd-endpoints", "http://127.0.0.1:2379"}, tlsFlags...), "--etcd-endpoints http://127.0.0.1:2379: with TLS the etcd client speaks https only"},
		{[]string{"--listen", "0.0.0.0:7070"}, "--listen: mtls: bad TLS configuration: refusing to serve the assigner's gRPC API on 0.0.0.0:7070 without TLS"},
		{[]string{"--metrics-listen", ":7071"}, "--metrics-listen: mtls: bad TLS configuration: refusing to serve the assigner's metrics on :7071 without TLS"},
		{[]string{"--embedded-etcd-listen", "0.0.0.0:2379"}, "refusing to serve the embedded etcd on 0.0.0.0:2379 without TLS"},
	} {
		cmd := NewCommand()
		cmd.SetArgs(append(tc.args, "--data-dir", data, "--log-level", "error"))
		cmd.SetErr(&bytes.Buffer{})
		err := cmd.ExecuteContext(context.Background())
		require.Error(t, err, "%v", tc.args)
		assert.Contains(t, err.Error(), tc.want, "%v", tc.args)
	}
	_, err := os.Stat(filepath.Join(data, "member"))
	assert.True(t, os.IsNotExist(err), "no etcd was started: %v", err)
}

func TestZoneLabelReachesTheCore(t *testing.T) {
	config := filepath.Join(t.TempDir(), "assigner.yaml")
	require.NoError(t, os.WriteFile(config, []byte("zone-label: topology.kubernetes.io/zone\n"), 0o644))
	o := &options{}
	cmd := newCommand(o)
	require.NoError(t, flagfile.Load(cmd.Flags(), config))
	assert.Equal(t, "topology.kubernetes.io/zone", o.coreConfig(nil, load.EstimatorConfig{}).ZoneLabel)

	o = &options{}
	require.NoError(t, newCommand(o).ParseFlags(nil))
	assert.Empty(t, o.coreConfig(nil, load.EstimatorConfig{}).ZoneLabel, "zones are ignored by default")
}

func TestMakeBeforeBreakReachesTheCore(t *testing.T) {
	o := &options{}
	require.NoError(t, newCommand(o).ParseFlags(nil))
	assert.False(t, o.coreConfig(nil, load.EstimatorConfig{}).BreakBeforeMake, "moves are make-before-break by default")
	assert.Equal(t, 30*time.Second, o.coreConfig(nil, load.EstimatorConfig{}).HandoffTimeout)
	assert.Equal(t, 2*time.Second, o.coreConfig(nil, load.EstimatorConfig{}).HandoffLinger)

	o = &options{}
	require.NoError(t, newCommand(o).ParseFlags([]string{"--make-before-break=false", "--handoff-timeout", "45s"}))
	cfg := o.coreConfig(nil, load.EstimatorConfig{})
	assert.True(t, cfg.BreakBeforeMake)
	assert.Equal(t, 45*time.Second, cfg.HandoffTimeout)
}
