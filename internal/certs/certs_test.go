package certs_test

import (
	"crypto/ecdsa"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"software.sslmate.com/src/go-pkcs12"

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

// A browser gets the certificate, its key and the CA in one PKCS#12 file; decoded, it gives
// back the same three, and only the owner reads it. A second write replaces it.
func TestPKCS12HoldsTheCertificateItsKeyAndTheCA(t *testing.T) {
	ca, err := certs.NewCA("test", time.Hour)
	require.NoError(t, err)
	dir := t.TempDir()
	req := certs.Request{Kind: "admin", Name: "alice"}
	leaf, err := ca.Issue(req)
	require.NoError(t, err)

	data, err := certs.EncodePKCS12(leaf, ca.Cert, "s3cret")
	require.NoError(t, err)
	key, cert, chain, err := pkcs12.DecodeChain(data, "s3cret")
	require.NoError(t, err)
	require.Equal(t, leaf.Cert.Raw, cert.Raw)
	require.Len(t, chain, 1)
	require.Equal(t, ca.Cert.Raw, chain[0].Raw)
	ec, ok := key.(*ecdsa.PrivateKey)
	require.True(t, ok, "key %T", key)
	require.True(t, ec.PublicKey.Equal(cert.PublicKey), "the key is the certificate's")
	_, _, _, err = pkcs12.DecodeChain(data, "wrong")
	require.ErrorIs(t, err, pkcs12.ErrIncorrectPassword)

	path, err := certs.WritePKCS12(dir, req, leaf, ca.Cert)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "admin-alice.p12"), path)
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "it holds a private key")
	first, err := os.ReadFile(path)
	require.NoError(t, err)
	_, cert, _, err = pkcs12.DecodeChain(first, certs.PKCS12Password)
	require.NoError(t, err)
	require.Equal(t, leaf.Cert.Raw, cert.Raw)

	renewed, err := ca.Issue(req)
	require.NoError(t, err)
	_, err = certs.WritePKCS12(dir, req, renewed, ca.Cert)
	require.NoError(t, err)
	second, err := os.ReadFile(path)
	require.NoError(t, err)
	_, cert, _, err = pkcs12.DecodeChain(second, certs.PKCS12Password)
	require.NoError(t, err)
	require.Equal(t, renewed.Cert.Raw, cert.Raw, "a rewrite replaces the file")

	_, err = certs.EncodePKCS12(&certs.Leaf{Cert: leaf.Cert, KeyPEM: []byte("not PEM")}, ca.Cert, "")
	require.ErrorIs(t, err, certs.ErrInvalid)
}
