package slicectl

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"software.sslmate.com/src/go-pkcs12"

	"github.com/sliceplane/sliceplane/internal/mtls"
)

func parseCertFile(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	b, _ := pem.Decode(data)
	require.NotNil(t, b, path)
	c, err := x509.ParseCertificate(b.Bytes)
	require.NoError(t, err)
	return c
}

// checkP12 verifies that dir holds kind-name's PKCS#12 file, only its owner reads it, and it
// decodes with the empty password into the certificate of the .crt beside it, a key of that
// certificate and ca.crt.
func checkP12(t *testing.T, dir, kind, name string) {
	t.Helper()
	base := filepath.Join(dir, kind+"-"+name)
	fi, err := os.Stat(base + ".p12")
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s.p12 holds a private key", base)
	data, err := os.ReadFile(base + ".p12")
	require.NoError(t, err)
	key, cert, chain, err := pkcs12.DecodeChain(data, "")
	require.NoError(t, err, "%s.p12 decodes with an empty password", base)
	assert.Equal(t, parseCertFile(t, base+".crt").Raw, cert.Raw, "%s.p12 holds the .crt's certificate", base)
	require.Len(t, chain, 1)
	assert.Equal(t, parseCertFile(t, filepath.Join(dir, "ca.crt")).Raw, chain[0].Raw, "%s.p12 holds ca.crt", base)
	ec, ok := key.(*ecdsa.PrivateKey)
	require.True(t, ok, "key %T", key)
	assert.True(t, ec.PublicKey.Equal(cert.PublicKey), "%s.p12's key is its certificate's", base)
}

// checkLeaf verifies that dir holds kind-name's certificate, naming that identity, signed
// by dir's CA, with a key only its owner reads, usable as mtls files; admins and viewers
// have a PKCS#12 file too, the others none.
func checkLeaf(t *testing.T, dir, kind, name string) *x509.Certificate {
	t.Helper()
	base := filepath.Join(dir, kind+"-"+name)
	c := parseCertFile(t, base+".crt")
	id, err := mtls.IdentityOf(c)
	require.NoError(t, err)
	assert.Equal(t, mtls.Identity{ID: "spiffe://sliceplane/" + kind + "/" + name, Kind: kind, Name: name}, id)
	roots := x509.NewCertPool()
	roots.AddCert(parseCertFile(t, filepath.Join(dir, "ca.crt")))
	_, err = c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err, "%s/%s verifies against ca.crt", kind, name)
	fi, err := os.Stat(base + ".key")
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s.key", base)
	src, err := mtls.Config{Cert: base + ".crt", Key: base + ".key", CA: filepath.Join(dir, "ca.crt")}.Load()
	require.NoError(t, err, "the files load as --tls-cert, --tls-key and --tls-ca")
	assert.Equal(t, id, src.Identity())
	if kind == "admin" || kind == "viewer" {
		checkP12(t, dir, kind, name)
	} else {
		assert.NoFileExists(t, base+".p12", "only the kinds a person uses in a browser get one")
	}
	return c
}

func TestCertsInitWritesACAAndEveryIdentity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	out, errOut, err := run(t, "certs", "init", dir, "--node", "n1,n2", "--distributor", "d1", "--assigner", "a1",
		"--admin", "alice", "--viewer", "v", "--router", "r", "--host", "h1.example,10.1.2.3", "--validity", "48h")
	require.NoError(t, err, errOut)

	ca := parseCertFile(t, filepath.Join(dir, "ca.crt"))
	assert.True(t, ca.IsCA)
	fi, err := os.Stat(filepath.Join(dir, "ca.key"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	for _, id := range [][2]string{{"node", "n1"}, {"node", "n2"}, {"distributor", "d1"}, {"assigner", "a1"}, {"admin", "alice"}, {"viewer", "v"}, {"router", "r"}} {
		c := checkLeaf(t, dir, id[0], id[1])
		assert.WithinDuration(t, time.Now().Add(48*time.Hour), c.NotAfter, time.Minute, "--validity")
		serves := id[0] == "node" || id[0] == "distributor" || id[0] == "assigner"
		assert.Equal(t, serves, slices.Contains(c.DNSNames, "h1.example"), "--host on %s", id)
		assert.Equal(t, serves, slices.ContainsFunc(c.IPAddresses, func(ip net.IP) bool { return ip.String() == "10.1.2.3" }), "--host on %s", id)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 2+2*7+2, "the CA, a pair per identity and a .p12 per admin and viewer, nothing else")

	assert.Contains(t, out, "wrote a new CA: "+filepath.Join(dir, "ca.crt"))
	assert.Regexp(t, `spiffe://sliceplane/admin/alice\s+--tls-cert `+regexpQuote(filepath.Join(dir, "admin-alice.crt"))+
		` --tls-key `+regexpQuote(filepath.Join(dir, "admin-alice.key"))+` --tls-ca `+regexpQuote(filepath.Join(dir, "ca.crt")), out)
	assert.Contains(t, out, "export SLICEPLANE_TLS_CERT="+filepath.Join(dir, "admin-alice.crt")+" SLICEPLANE_TLS_KEY=")
	assert.Contains(t, out, "In a browser")
	assert.Regexp(t, `spiffe://sliceplane/viewer/v\s+`+regexpQuote(filepath.Join(dir, "viewer-v.p12"))+"\n", out)
	assert.NotContains(t, out, "node-n1.p12")

	js, _, err := run(t, "certs", "init", dir, "--viewer", "v", "-o", "json")
	require.NoError(t, err)
	var got certsInitOut
	require.NoError(t, json.Unmarshal([]byte(js), &got), js)
	require.Len(t, got.Identities, 1)
	assert.Equal(t, filepath.Join(dir, "viewer-v.p12"), got.Identities[0].P12)

	show, _, err := run(t, "certs", "show", filepath.Join(dir, "node-n1.crt"), "--ca", filepath.Join(dir, "ca.crt"), "-o", "json")
	require.NoError(t, err)
	var shown []certShowOut
	require.NoError(t, json.Unmarshal([]byte(show), &shown), show)
	require.Len(t, shown, 1)
	assert.Equal(t, "spiffe://sliceplane/node/n1", shown[0].Identity)
	assert.Equal(t, "valid", shown[0].Validity)
	assert.Equal(t, "yes, by --ca", shown[0].Verified)
	assert.Contains(t, shown[0].Hosts, "h1.example")
}

func TestCertsInitReusesTheCA(t *testing.T) {
	dir := t.TempDir()
	_, errOut, err := run(t, "certs", "init", dir, "--node", "n1")
	require.NoError(t, err, errOut)
	caBefore, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	require.NoError(t, err)
	keyBefore, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	require.NoError(t, err)

	out, errOut, err := run(t, "certs", "init", dir, "--admin", "bob")
	require.NoError(t, err, errOut)
	assert.Contains(t, out, "reused the CA")
	caAfter, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	require.NoError(t, err)
	keyAfter, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	require.NoError(t, err)
	assert.Equal(t, caBefore, caAfter)
	assert.Equal(t, keyBefore, keyAfter)
	checkLeaf(t, dir, "node", "n1")
	checkLeaf(t, dir, "admin", "bob")

	// A rerun renews bob's files, the .p12 with the rest.
	p12Before, err := os.ReadFile(filepath.Join(dir, "admin-bob.p12"))
	require.NoError(t, err)
	_, errOut, err = run(t, "certs", "init", dir, "--admin", "bob")
	require.NoError(t, err, errOut)
	p12After, err := os.ReadFile(filepath.Join(dir, "admin-bob.p12"))
	require.NoError(t, err)
	assert.NotEqual(t, p12Before, p12After, "the .p12 is replaced")
	checkLeaf(t, dir, "admin", "bob")

	// The CA bounds what it signs.
	_, _, err = run(t, "certs", "init", dir, "--admin", "carol", "--validity", "100000h")
	require.ErrorIs(t, err, ErrUsage)
	assert.Contains(t, err.Error(), "the certificates would outlive the CA")
	assert.NoFileExists(t, filepath.Join(dir, "admin-carol.crt"))

	// Half a CA is neither reused nor replaced.
	require.NoError(t, os.Remove(filepath.Join(dir, "ca.key")))
	_, _, err = run(t, "certs", "init", dir, "--admin", "carol")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "holds one of ca.crt and ca.key but not the other")
	assert.NoFileExists(t, filepath.Join(dir, "admin-carol.crt"))
}

func TestCertsInitRefusesBadNamesAndWritesNothing(t *testing.T) {
	for _, args := range [][]string{
		{"--node", "n1,bad/name"},
		{"--admin", "alice", "--viewer", ".."},
		{"--node", "n1", "--router", "r x"},
		{"--node", "n1,n1"},
		{"--node", "n1", "--validity", "-1h"},
	} {
		dir := filepath.Join(t.TempDir(), "certs")
		_, _, err := run(t, append([]string{"certs", "init", dir}, args...)...)
		require.ErrorIs(t, err, ErrUsage, "%q", args)
		assert.NoDirExists(t, dir, "%q: nothing written", args)
	}
	_, _, err := run(t, "certs", "init", t.TempDir(), "--node", "n1/x")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `--node: certs: invalid request: name "n1/x" may hold only letters, digits`)
	assert.Contains(t, err.Error(), "nothing was written")

	// With a CA there already, a bad name adds nothing next to it.
	dir := t.TempDir()
	_, _, err = run(t, "certs", "init", dir, "--node", "n1")
	require.NoError(t, err)
	_, _, err = run(t, "certs", "init", dir, "--node", "n2,n3!")
	require.ErrorIs(t, err, ErrUsage)
	assert.NoFileExists(t, filepath.Join(dir, "node-n2.crt"))
	_, _, err = run(t, "certs", "init", dir, "--admin", "alice", "--viewer", "v!")
	require.ErrorIs(t, err, ErrUsage)
	assert.NoFileExists(t, filepath.Join(dir, "admin-alice.crt"))
	assert.NoFileExists(t, filepath.Join(dir, "admin-alice.p12"))

	// A CA made for certificates longer than its default outlives them.
	dir = t.TempDir()
	_, errOut, err := run(t, "certs", "init", dir, "--node", "n1", "--validity", "100000h")
	require.NoError(t, err, errOut)
	assert.True(t, parseCertFile(t, filepath.Join(dir, "node-n1.crt")).NotAfter.Before(parseCertFile(t, filepath.Join(dir, "ca.crt")).NotAfter))

	_, _, err = run(t, "certs", "init")
	require.ErrorIs(t, err, ErrUsage)
	_, _, err = run(t, "certs", "show")
	require.ErrorIs(t, err, ErrUsage)
}
