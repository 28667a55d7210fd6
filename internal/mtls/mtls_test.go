package mtls_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTheFilesComeAsASetOfThree(t *testing.T) {
	p := mtlstest.New(t)
	full := p.Config("node", "n1")
	for name, c := range map[string]mtls.Config{
		"no key":            {Cert: full.Cert, CA: full.CA},
		"no ca":             {Cert: full.Cert, Key: full.Key},
		"insecure with tls": {Cert: full.Cert, Key: full.Key, CA: full.CA, Insecure: true},
		"missing file":      {Cert: full.Cert + ".gone", Key: full.Key, CA: full.CA},
	} {
		_, err := c.Load()
		require.True(t, errors.Is(err, mtls.ErrConfig), "%s: %v", name, err)
	}
	src, err := mtls.Config{}.Load()
	require.NoError(t, err)
	require.Nil(t, src, "no files: plaintext")
	require.Equal(t, "plaintext", src.Mode())
}

func TestIdentityIsTheOneSpiffeURI(t *testing.T) {
	uri := func(s string) *url.URL { u, err := url.Parse(s); require.NoError(t, err); return u }
	for name, tc := range map[string]struct {
		uris []string
		want string
	}{
		"node":         {[]string{"spiffe://sliceplane/node/n2"}, "spiffe://sliceplane/node/n2"},
		"other domain": {[]string{"spiffe://example.org/node/n2"}, ""},
		"with others":  {[]string{"https://example.org/x", "spiffe://sliceplane/admin/alice"}, "spiffe://sliceplane/admin/alice"},
		"too deep":     {[]string{"spiffe://sliceplane/node/n2/x"}, ""},
		"no name":      {[]string{"spiffe://sliceplane/node/"}, ""},
		"two":          {[]string{"spiffe://sliceplane/node/n1", "spiffe://sliceplane/admin/a"}, ""},
		"none":         {nil, ""},
	} {
		c := &x509.Certificate{}
		for _, u := range tc.uris {
			c.URIs = append(c.URIs, uri(u))
		}
		id, err := mtls.IdentityOf(c)
		if tc.want == "" {
			require.True(t, errors.Is(err, mtls.ErrNoIdentity), "%s: %v", name, err)
			continue
		}
		require.NoError(t, err, name)
		require.Equal(t, tc.want, id.ID, name)
	}
}

func TestPlaintextStaysOnLoopbackUnlessInsecure(t *testing.T) {
	for addr, loop := range map[string]bool{
		"127.0.0.1:7070": true, "localhost:7070": true, "[::1]:7070": true,
		":7070": false, "0.0.0.0:7070": false, "10.0.0.1:7070": false, "assigner-1:7070": false,
	} {
		require.Equal(t, loop, mtls.Loopback(addr), addr)
		err := mtls.CheckListen(nil, false, "gRPC", addr)
		if loop {
			require.NoError(t, err, addr)
		} else {
			require.ErrorContains(t, err, "refusing to serve gRPC on "+addr+" without TLS", addr)
			require.NoError(t, mtls.CheckListen(nil, true, "gRPC", addr), "--insecure allows "+addr)
		}
	}
	p := mtlstest.New(t)
	require.NoError(t, mtls.CheckListen(p.Source("assigner", "a1"), false, "gRPC", ":7070"))
}

// handshake connects a client with client's files to a server with server's, the client
// expecting kinds, and returns the errors of both sides.
func handshake(t *testing.T, server, client *mtls.Source, kinds ...string) error {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server.ServerConfig())
	require.NoError(t, err)
	defer lis.Close()
	done := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err == nil {
			err = c.(*tls.Conn).Handshake()
			c.Close()
		}
		done <- err
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), client.ClientConfig(kinds...))
	if err == nil {
		// In TLS 1.3 the server checks the client's certificate after the client is done:
		// a read shows whether it was accepted.
		c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // best effort
		if _, rerr := c.Read(make([]byte, 1)); rerr != nil && !errors.Is(rerr, io.EOF) {
			err = rerr
		}
		c.Close()
	}
	return errors.Join(err, <-done)
}

func TestClientsCheckTheServersChainAndKind(t *testing.T) {
	p := mtlstest.New(t)
	assigner, node := p.Source("assigner", "a1"), p.Source("node", "n1")
	require.NoError(t, handshake(t, assigner, node, "assigner"))
	require.ErrorContains(t, handshake(t, assigner, node, "distributor"), "not one of the kinds")

	stranger := mtlstest.New(t).Source("assigner", "a1")
	require.Error(t, handshake(t, stranger, node), "a server of another CA")
	require.Error(t, handshake(t, assigner, stranger), "a client of another CA")

	old := p.Issue(certs.Request{Kind: "assigner", Name: "old", NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	expired, err := old.Load()
	require.NoError(t, err)
	require.ErrorContains(t, handshake(t, expired, node), "expired")
}

func TestRotatedFilesAreUsedWithoutARestart(t *testing.T) {
	defer func(d time.Duration) { mtls.CheckInterval = d }(mtls.CheckInterval)
	mtls.CheckInterval = 0
	p := mtlstest.New(t)
	cfg := p.Config("node", "n1")
	src, err := cfg.Load()
	require.NoError(t, err)
	server := p.Source("assigner", "a1")
	require.NoError(t, handshake(t, server, src))

	// A rotation half done (a key that is not the certificate's) keeps the old pair working.
	other := p.Config("node", "n9")
	key, err := os.ReadFile(other.Key)
	require.NoError(t, err)
	require.NoError(t, certs.WriteAtomic(cfg.Key, key, 0o600))
	require.NoError(t, handshake(t, server, src))
	n, lastErr := src.Reloads()
	require.Equal(t, 0, n)
	require.Error(t, lastErr)
	require.Equal(t, "spiffe://sliceplane/node/n1", src.Identity().ID)

	// Then the certificate arrives: the new pair is in use at the next handshake.
	crt, err := os.ReadFile(other.Cert)
	require.NoError(t, err)
	require.NoError(t, certs.WriteAtomic(cfg.Cert, crt, 0o644))
	require.NoError(t, handshake(t, server, src))
	n, lastErr = src.Reloads()
	require.Equal(t, 1, n)
	require.NoError(t, lastErr)
	require.Equal(t, "spiffe://sliceplane/node/n9", src.Identity().ID)

	// A new CA replaces the old one: servers of the old CA are no longer trusted; a bundle
	// of both (how a CA rotation starts) trusts either.
	oldCA, err := os.ReadFile(cfg.CA)
	require.NoError(t, err)
	nextCA, err := os.ReadFile(mtlstest.New(t).Config("assigner", "a2").CA)
	require.NoError(t, err)
	require.NoError(t, certs.WriteAtomic(cfg.CA, nextCA, 0o644))
	require.ErrorContains(t, handshake(t, server, src), "unknown authority")
	require.NoError(t, certs.WriteAtomic(cfg.CA, append(nextCA, oldCA...), 0o644))
	require.NoError(t, handshake(t, server, src))
}

func TestAListenerOnAnyAddressIsNotLoopback(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	require.True(t, mtls.Loopback(l.Addr().String()))
}

func TestAVerifiedClientIsRememberedUntilTheCAsChange(t *testing.T) {
	defer func(d time.Duration) { mtls.CheckInterval = d }(mtls.CheckInterval)
	mtls.CheckInterval = 0
	p := mtlstest.New(t)
	serverCfg := p.Config("assigner", "a1")
	server, err := serverCfg.Load()
	require.NoError(t, err)
	client := p.Issue(certs.Request{Kind: "node", Name: "n1"})
	pair, err := tls.LoadX509KeyPair(client.Cert, client.Key)
	require.NoError(t, err)
	chain := []*x509.Certificate{pair.Leaf}

	for range 2 { // the second answer comes from what the first remembered
		id, err := server.VerifyClient(chain)
		require.NoError(t, err)
		require.Equal(t, "spiffe://sliceplane/node/n1", id.ID)
	}
	// Another CA replaces this one: the chain remembered is verified again, and fails.
	other, err := os.ReadFile(mtlstest.New(t).Config("assigner", "x").CA)
	require.NoError(t, err)
	require.NoError(t, certs.WriteAtomic(serverCfg.CA, other, 0o644))
	_, err = server.VerifyClient(chain)
	require.ErrorContains(t, err, "unknown authority")
}
