package certs_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

func TestIssuedCertificatesNameTheirIdentityAndVerify(t *testing.T) {
	ca, err := certs.NewCA("test", time.Hour)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, certs.WriteCA(dir, ca))
	req := certs.Request{Kind: "node", Name: "n2", Hosts: []string{"kv-2.example", "10.1.2.3"}}
	leaf, err := ca.Issue(req)
	require.NoError(t, err)
	files, err := certs.WriteLeaf(dir, req, leaf)
	require.NoError(t, err)

	src, err := mtls.Config{Cert: files.Cert, Key: files.Key, CA: files.CA}.Load()
	require.NoError(t, err)
	require.Equal(t, mtls.Identity{ID: "spiffe://sliceplane/node/n2", Kind: "node", Name: "n2"}, src.Identity())
	require.Contains(t, leaf.Cert.DNSNames, "kv-2.example")
	require.Equal(t, "10.1.2.3", leaf.Cert.IPAddresses[len(leaf.Cert.IPAddresses)-1].String())

	info, err := os.Stat(files.Key)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "a private key is readable by its owner only")
}

func TestBadNamesAreRefused(t *testing.T) {
	ca, err := certs.NewCA("test", time.Hour)
	require.NoError(t, err)
	for _, r := range []certs.Request{
		{Kind: "node", Name: ""}, {Kind: "", Name: "n1"}, {Kind: "node", Name: "a/b"},
		{Kind: "node", Name: ".."}, {Kind: "node", Name: "n 1"},
	} {
		_, err := ca.Issue(r)
		require.True(t, errors.Is(err, certs.ErrInvalid), "%+v: %v", r, err)
	}
}

func TestACAIsNeverOverwrittenAndLoadsBack(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA("first", time.Hour)
	require.NoError(t, err)
	require.NoError(t, certs.WriteCA(dir, ca))
	other, err := certs.NewCA("second", time.Hour)
	require.NoError(t, err)
	require.Error(t, certs.WriteCA(dir, other), "a second CA would orphan every certificate of the first")

	back, err := certs.LoadCA(dir)
	require.NoError(t, err)
	require.Equal(t, ca.Cert.Raw, back.Cert.Raw)
	leaf, err := back.Issue(certs.Request{Kind: "admin", Name: "alice"})
	require.NoError(t, err)
	require.NoError(t, leaf.Cert.CheckSignatureFrom(ca.Cert))

	_, err = certs.LoadCA(filepath.Join(dir, "missing"))
	require.Error(t, err)
}
