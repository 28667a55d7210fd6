package assignermain

import (
	"bytes"
	"context"
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

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
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
	} {
		cmd := NewCommand()
		cmd.SetArgs(c.args)
		cmd.SetErr(&bytes.Buffer{})
		err := cmd.ExecuteContext(context.Background())
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.want, "%v", c.args)
	}
}
