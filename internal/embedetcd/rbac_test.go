package embedetcd

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

// With client-certificate auth, etcd names a client by its certificate's CN, which the
// development certificates set to <kind>/<name>: etcd's own RBAC then narrows what each
// Sliceplane identity may touch, with no password in any process (docs/SECURITY.md, etcd).
func TestEtcdRBACKnowsClientsByTheirCertificate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pki := mtlstest.New(t)
	s, err := Start(ctx, Options{Dir: t.TempDir(), Fast: true, LogLevel: "fatal", TLS: pki.Config("etcd", "e1")})
	require.NoError(t, err)
	defer s.Close()
	client := func(src *mtls.Source) *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second,
			TLS: src.ClientTLS(), Logger: zap.NewNop()})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}

	setup := client(pki.Source("admin", "setup"))
	for _, step := range []func() error{
		func() error { _, err := setup.RoleAdd(ctx, "sliceplane"); return err },
		func() error {
			_, err := setup.RoleGrantPermission(ctx, "sliceplane", "/sliceplane/", clientv3.GetPrefixRangeEnd("/sliceplane/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error {
			_, err := setup.UserAddWithOptions(ctx, "assigner/a1", "", &clientv3.UserAddOptions{NoPassword: true})
			return err
		},
		func() error { _, err := setup.UserGrantRole(ctx, "assigner/a1", "sliceplane"); return err },
		func() error { _, err := setup.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := setup.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := setup.AuthEnable(ctx); return err },
	} {
		require.NoError(t, step())
	}

	assigner := client(pki.Source("assigner", "a1"))
	_, err = assigner.Put(ctx, "/sliceplane/assigner/x", "v")
	require.NoError(t, err, "the assigner's certificate is user assigner/a1, granted /sliceplane/")
	_, err = assigner.Put(ctx, "/elsewhere", "v")
	require.ErrorIs(t, err, rpctypes.ErrPermissionDenied, "and nothing outside it")

	node := client(pki.Source("node", "n1"))
	_, err = node.Put(ctx, "/sliceplane/assigner/x", "forged")
	require.Error(t, err, "a node's certificate names a user etcd does not have")
	got, err := assigner.Get(ctx, "/sliceplane/assigner/x")
	require.NoError(t, err)
	require.Equal(t, "v", string(got.Kvs[0].Value))
}
