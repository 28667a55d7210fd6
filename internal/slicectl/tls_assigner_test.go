package slicectl

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

// TestTLSAgainstTheAssigner runs slicectl against a real assigner with mutual TLS: a viewer
// inspects, is refused an override with a message naming it, an admin's change is recorded
// as made by that admin, and a slicectl without a certificate is told to give one.
func TestTLSAgainstTheAssigner(t *testing.T) {
	p := mtlstest.New(t)
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) { cfg.TLS = p.Source("assigner", "a1") }})
	addr := c.Assigners()[0]
	viewer, alice := p.Config("viewer", "v"), p.Config("admin", "alice")
	ctl := func(as mtls.Config, args ...string) (string, string, error) {
		return run(t, append(append([]string{"--assigner", addr, "--timeout", "20s"}, tlsFlags(as)...), args...)...)
	}

	out, errOut, err := ctl(viewer, "status")
	require.NoError(t, err, errOut)
	assert.Regexp(t, `(?m)^leader\s+`, out)

	_, _, err = ctl(viewer, "drain", "n1")
	require.ErrorIs(t, err, ErrPermission)
	assert.Regexp(t, `^drain: permission denied: spiffe://sliceplane/viewer/v .*may not call /sliceplane.v1.AdminService/Drain`, err.Error())

	_, errOut, err = ctl(alice, "freeze", "--reason", "tls test")
	require.NoError(t, err, errOut)
	out, errOut, err = ctl(viewer, "quanta", "-o", "json")
	require.NoError(t, err, errOut)
	var by []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var q struct {
			By    string `json:"by"`
			Cause string `json:"cause"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &q), line)
		if strings.Contains(q.Cause, "freeze") || strings.Contains(q.Cause, "frozen") {
			by = append(by, q.By)
		}
	}
	assert.Equal(t, []string{"spiffe://sliceplane/admin/alice"}, by, "the freeze is recorded as alice's:\n%s", out)

	_, _, err = run(t, "--assigner", addr, "--timeout", "1s", "status")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the assigner at "+addr+" requires TLS: give --tls-cert")
}

// TestTLSDataAgainstEtcd: the data commands reach an etcd that requires client certificates
// with the same flags.
func TestTLSDataAgainstEtcd(t *testing.T) {
	p := mtlstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Options{Dir: t.TempDir(), TLS: p.Config("etcd", "e1")})
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	admin := p.Config("admin", "alice")
	base := append([]string{"data", "--etcd-endpoints", srv.Endpoint(), "--timeout", "10s"}, tlsFlags(admin)...)

	_, errOut, err := run(t, append(base, "put", "user:1", "alice")...)
	require.NoError(t, err, errOut)
	out, errOut, err := run(t, append(base, "get", "user:1")...)
	require.NoError(t, err, errOut)
	assert.Contains(t, out, `"alice"`)

	_, _, err = run(t, "data", "--etcd-endpoints", srv.Endpoint(), "--timeout", "1s", "get", "user:1")
	require.Error(t, err, "no certificate, no data")
	assert.Contains(t, err.Error(), "etcd at "+srv.Endpoint()+" requires TLS: give --tls-cert")
	_, _, err = run(t, "data", "--etcd-endpoints", strings.TrimPrefix(srv.Endpoint(), "https://"), "--timeout", "1s", "get", "user:1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "requires TLS: give --tls-cert", "found by a handshake without the scheme")
}
