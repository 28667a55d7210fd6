package distributormain

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/membership"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHelpExplainsEveryFlag(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	require.NoError(t, cmd.Execute())
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Deprecated != "" {
			assert.NotContains(t, out.String(), "--"+f.Name, "the help hides deprecated --%s", f.Name)
			return
		}
		assert.Contains(t, out.String(), "--"+f.Name, "the help lists --%s", f.Name)
		assert.NotEmpty(t, f.Usage, "--%s has a description", f.Name)
	})
	assert.Contains(t, out.String(), "snapshot")
}

// startAssigner runs an assigner on etcd until the test ends and returns its address.
func startAssigner(t *testing.T, etcd *embedetcd.Server) string {
	t.Helper()
	srv, err := assigner.New(assigner.Config{
		Client: etcdtest.Client(t, etcd), PassInterval: 100 * time.Millisecond, ClockInterval: 10 * time.Millisecond,
		SessionTTL: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done, "assigner")
	})
	return srv.Addr()
}

func TestRunRegistersAndLeavesOnStop(t *testing.T) {
	t.Run("one target", func(t *testing.T) { registersAndLeaves(t, nil, "/sliceplane/") })
	// Blue is no target of the assigner's: its lane follows no quanta, and registers all the same.
	sources := filepath.Join(t.TempDir(), "sources.yaml")
	require.NoError(t, os.WriteFile(sources, []byte("blue: {source: etcd}\n"), 0o644))
	t.Run("two targets", func(t *testing.T) {
		registersAndLeaves(t, []string{"--target", "default,blue", "--sources", sources}, "/sliceplane/", "/sliceplane/t/blue/")
	})
}

// registersAndLeaves runs a distributor with args and checks that it registers under every
// root of roots, serves, and leaves them all on stop.
func registersAndLeaves(t *testing.T, args []string, roots ...string) {
	etcd := etcdtest.Start(t)
	cli := etcdtest.Client(t, etcd)
	assignerAddr := startAssigner(t, etcd)

	config := filepath.Join(t.TempDir(), "distributor.yaml")
	require.NoError(t, os.WriteFile(config, []byte(strings.Join([]string{
		"id: d1",
		"max-queue-bytes: 32MiB",
		"max-in-flight-bytes: 1048576",
		"log-level: warn",
	}, "\n")), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := NewCommand()
	cmd.SetArgs(append([]string{"--config", config, "--etcd-endpoints", etcd.Endpoint(), "--assigners", assignerAddr,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, args...))
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	var addr string
	deadline := time.Now().Add(30 * time.Second)
	for {
		var addrs []string
		for _, root := range roots {
			set, _, err := membership.Load(ctx, cli, root)
			require.NoError(t, err)
			if set["d1"] != "" {
				addrs = append(addrs, set["d1"])
			}
		}
		if len(addrs) == len(roots) {
			addr = addrs[0]
			require.Equal(t, addrs[0], addrs[len(addrs)-1], "one address for every target")
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the distributor stopped before registering: %v", err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "d1 not registered within 30s")
		time.Sleep(20 * time.Millisecond)
	}

	// The registered address is the one bound, and serves.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	health, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	require.NoError(t, err, "health check at the registered address %s", addr)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, health.GetStatus())

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "a cancelled run is a clean stop")
	case <-time.After(30 * time.Second):
		t.Fatal("did not stop")
	}
	// At once, not after the 5 s lease: a stopping distributor revokes it.
	for _, root := range roots {
		set, _, err := membership.Load(context.Background(), cli, root)
		require.NoError(t, err)
		assert.NotContains(t, set, "d1", "the distributor left the set of %s when it stopped", root)
	}
}

func TestBadSettingsAreUsageErrors(t *testing.T) {
	dir := t.TempDir()
	badKey := filepath.Join(dir, "bad-key.yaml")
	require.NoError(t, os.WriteFile(badKey, []byte("lisen: 127.0.0.1:1\n"), 0o644))
	badValue := filepath.Join(dir, "bad-value.yaml")
	require.NoError(t, os.WriteFile(badValue, []byte("max-delta-bytes: lots\n"), 0o644))
	file := func(name, text string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
		return path
	}
	sourceTypo := file("typo.yaml", "kv: {pg-tabel: t}\n")
	sourceIncomplete := file("incomplete.yaml", "counter: {source: postgres}\n")
	sourceElsewhere := file("elsewhere.yaml", "counter: {}\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"--log-format", "xml"}, `--log-format "xml"`},
		{[]string{"--config", "/does/not/exist.yaml"}, "no such file"},
		{[]string{"--config", badKey}, `"lisen" is not a flag`},
		{[]string{"--config", badValue}, "max-delta-bytes"},
		{[]string{"stray"}, "unknown command"},
		{[]string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"--id", "d 1"}, "--id: "},
		{[]string{"--listen", "nonsense"}, "--listen: "},
		{[]string{"--advertise", "nonsense"}, "--advertise: "},
		{[]string{"--metrics-listen", "nonsense"}, "--metrics-listen: "},
		{[]string{"--assigners", "127.0.0.1:7070,nonsense"}, "--assigners: "},
		{[]string{"--assigners", ""}, "--assigners: want at least one"},
		{[]string{"--etcd-endpoints", ""}, "--etcd-endpoints: want at least one"},
		{[]string{"--session-ttl", "500ms"}, "--session-ttl 500ms: want whole seconds"},
		{[]string{"--session-ttl", "1500ms"}, "--session-ttl 1.5s: want whole seconds"},
		{[]string{"--session-ttl", "soon"}, `"--session-ttl"`},
		{[]string{"--clock-interval", "0s"}, "--clock-interval 0s"},
		{[]string{"--max-delta-ops", "0"}, "--max-delta-ops 0: want at least 1"},
		{[]string{"--max-delta-ops", "many"}, `"--max-delta-ops"`},
		{[]string{"--max-delta-bytes", "0"}, "--max-delta-bytes 0: want at least 1"},
		{[]string{"--max-in-flight-bytes", "-1"}, `"--max-in-flight-bytes"`},
		{[]string{"--max-queue-bytes", "12XB"}, `"--max-queue-bytes"`},
		{[]string{"--scan-workers", "-2"}, "--scan-workers -2: want at least 1"},
		{[]string{"--source", "mysql"}, `--source "mysql": want etcd or postgres`},
		{[]string{"--source", "postgres"}, "--source postgres needs --pg-dsn"},
		{[]string{"--source", "postgres", "--pg-dsn", "host=x", "--pg-table", "a;b"}, "plain identifiers"},
		{[]string{"--max-scan-ahead-bytes", "0"}, "--max-scan-ahead-bytes 0: want at least 1"},
		{[]string{"--target", "kv,kv"}, `--target: target "kv" given twice`},
		{[]string{"--target", "Not_A_Name"}, "--target: "},
		{[]string{"--target", "kv,counter", "--source", "postgres", "--pg-dsn", "host=x"}, "--source postgres serves one target"},
		{[]string{"--target", "kv", "--sources", sourceTypo}, `target kv: "pg-tabel" is not a flag`},
		{[]string{"--target", "counter", "--sources", sourceIncomplete}, "target counter: --source postgres needs --pg-dsn"},
		{[]string{"--target", "kv", "--sources", sourceElsewhere}, `target "counter" is not among --target kv`},
	} {
		args := c.args
		if !strings.HasPrefix(c.want, "--id") {
			// Else the test would depend on the machine's host name.
			args = append([]string{"--id", "d1"}, args...)
		}
		cmd := NewCommand()
		cmd.SetArgs(args)
		cmd.SetErr(&bytes.Buffer{})
		err := cmd.ExecuteContext(context.Background())
		require.Error(t, err, "%v", args)
		assert.Contains(t, err.Error(), c.want, "%v", args)
		assert.ErrorIs(t, err, ErrUsage, "%v: main exits with status 2", args)
	}
}

func TestIDDefaultsToHostName(t *testing.T) {
	defer func(h func() (string, error)) { hostname = h }(hostname)
	valid := func() *options {
		return &options{listen: "127.0.0.1:0", assigners: []string{"127.0.0.1:7070"}, endpoints: []string{"http://127.0.0.1:2379"},
			sessionTTL: time.Second, clockInterval: time.Millisecond, maxDeltaOps: 1, maxDeltaBytes: 1,
			maxInFlightBytes: 1, maxQueueBytes: 1, maxBufferedBytes: 1, scanWorkers: 1, maxScanAhead: 1}
	}

	hostname = func() (string, error) { return "node-7.rack_2:east", nil }
	o := valid()
	require.NoError(t, o.validate())
	assert.Equal(t, "node-7.rack_2:east", o.id)

	o = valid()
	o.id = "d1"
	require.NoError(t, o.validate())
	assert.Equal(t, "d1", o.id, "--id wins over the host name")

	hostname = func() (string, error) { return "my host", nil }
	err := valid().validate()
	require.ErrorIs(t, err, ErrUsage)
	assert.Contains(t, err.Error(), "--id is not set and the host name cannot be the ID")

	hostname = func() (string, error) { return "", errors.New("no uts") }
	err = valid().validate()
	require.ErrorIs(t, err, ErrUsage)
	assert.Contains(t, err.Error(), "host name is unknown (no uts)")
}

func TestRuntimeFailuresAreNotUsageErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	cmd := NewCommand()
	cmd.SetArgs([]string{"--id", "d1", "--listen", busy.Addr().String(), "--metrics-listen", "",
		"--etcd-endpoints", "http://127.0.0.1:1", "--log-level", "error"})
	err = cmd.ExecuteContext(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "listening on "+busy.Addr().String())
	assert.NotErrorIs(t, err, ErrUsage, "main exits with status 1")
}

func TestByteSizes(t *testing.T) {
	for in, want := range map[string]int{
		"0": 0, "512": 512, "512B": 512, "1048576": 1 << 20, "64MiB": 64 << 20, "1 KiB": 1 << 10, "2GiB": 2 << 30,
	} {
		var b byteSize
		require.NoError(t, b.Set(in), in)
		assert.Equal(t, want, int(b), in)
	}
	for _, in := range []string{"", "MiB", "-1", "1.5MiB", "1MB", "64 mib", "9999999999999GiB"} {
		var b byteSize
		assert.Error(t, b.Set(in), "%q", in)
	}
	for b, want := range map[byteSize]string{0: "0", 1000: "1000", 1536: "1536", 4096: "4KiB", 1 << 20: "1MiB", 3 << 30: "3GiB"} {
		assert.Equal(t, want, b.String())
	}
}
