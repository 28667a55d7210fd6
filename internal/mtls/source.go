package mtls

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// CheckInterval is how often, at most, a Source looks at its files for a change: the delay
// of a rotation.
var CheckInterval = time.Second

// Source holds a process's certificate and trusted CAs, re-read when the files change. Its
// methods are safe for concurrent use; a nil Source stands for plaintext.
type Source struct {
	cfg Config

	mu      sync.Mutex
	cur     *material
	stamp   [3]fileStamp
	checked time.Time
	reloads int
	lastErr error
	cache   map[[sha256.Size]byte]verification // by the digest of a verified client chain's leaf
}

// material is one loaded set of files.
type material struct {
	cert *tls.Certificate
	pool *x509.CertPool
	id   Identity
}

// fileStamp is the digest of a file's content: a modification time and a size miss a
// rotation within the file system's clock tick that keeps the size (a new key of the same
// curve), and the files are a few kilobytes read at most once per CheckInterval.
type fileStamp [sha256.Size]byte

func newSource(c Config) (*Source, error) {
	s := &Source{cfg: c}
	stamp, err := s.stamps()
	if err != nil {
		return nil, err
	}
	m, err := load(c)
	if err != nil {
		return nil, err
	}
	s.cur, s.stamp, s.checked = m, stamp, time.Now()
	return s, nil
}

// Identity returns the identity of the process's own certificate.
func (s *Source) Identity() Identity { return s.current().id }

// Reloads returns how many times the files were re-read after a change, and the error of the
// last attempt that failed since the last success (nil if none).
func (s *Source) Reloads() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloads, s.lastErr
}

// current returns the loaded material, first re-reading the files if CheckInterval passed
// and one of them changed.
func (s *Source) current() *material {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if now.Sub(s.checked) < CheckInterval {
		return s.cur
	}
	s.checked = now
	stamp, err := s.stamps()
	if err != nil || stamp == s.stamp {
		return s.cur
	}
	m, err := load(s.cfg)
	if err != nil {
		// Half of a rotation (a new certificate, the old key): keep what works, look again.
		if s.lastErr == nil || s.lastErr.Error() != err.Error() {
			slog.Warn("mtls: keeping the last good certificates", "err", err)
		}
		s.lastErr = err
		return s.cur
	}
	s.cur, s.stamp, s.lastErr = m, stamp, nil
	s.reloads++
	slog.Info("mtls: reloaded certificates", "identity", m.id.ID, "not_after", m.cert.Leaf.NotAfter)
	return s.cur
}

func (s *Source) stamps() ([3]fileStamp, error) {
	var out [3]fileStamp
	for i, p := range []string{s.cfg.Cert, s.cfg.Key, s.cfg.CA} {
		data, err := os.ReadFile(p)
		if err != nil {
			return out, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		out[i] = sha256.Sum256(data)
	}
	return out, nil
}

func load(c Config) (*material, error) {
	cert, err := tls.LoadX509KeyPair(c.Cert, c.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: loading %s and %s: %w", ErrConfig, c.Cert, c.Key, err)
	}
	caPEM, err := os.ReadFile(c.CA)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrConfig, c.CA)
	}
	id, err := IdentityOf(cert.Leaf)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, c.Cert, err)
	}
	return &material{cert: &cert, pool: pool, id: id}, nil
}

// ServerConfig returns the TLS configuration of a server: its current certificate, and a
// client certificate required and verified against the current CAs.
func (s *Source) ServerConfig() *tls.Config {
	return s.serverConfig(tls.RequireAndVerifyClientCert, "h2", "http/1.1")
}

// ClientConfig returns the TLS configuration of a client: its current certificate, and the
// server's chain verified against the current CAs and its identity's kind against kinds
// (any kind when none is named). Host names are not checked: see the package comment.
func (s *Source) ClientConfig(kinds ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The chain is verified below, against the CAs of the moment; Go's own check would
		// use a fixed pool and the host name.
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection verifies
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.current().cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			return s.verifyServer(cs, kinds)
		},
	}
}

func (s *Source) verifyServer(cs tls.ConnectionState, kinds []string) error {
	id, err := s.verifyChain(cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return fmt.Errorf("mtls: the server's certificate: %w", err)
	}
	if len(kinds) == 0 {
		return nil
	}
	for _, k := range kinds {
		if id.Kind == k {
			return nil
		}
	}
	return fmt.Errorf("mtls: the server is %s, not one of the kinds %v this client talks to", id.ID, kinds)
}

// verifyChain verifies a peer's chain against the current CAs for usage and returns the
// identity its leaf names.
func (s *Source) verifyChain(chain []*x509.Certificate, usage x509.ExtKeyUsage) (Identity, error) {
	return verifyAgainst(s.current(), chain, usage)
}

func verifyAgainst(m *material, chain []*x509.Certificate, usage x509.ExtKeyUsage) (Identity, error) {
	if len(chain) == 0 {
		return Identity{}, errors.New("no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: m.pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}
	if _, err := chain[0].Verify(opts); err != nil {
		return Identity{}, err
	}
	return IdentityOf(chain[0])
}

// GRPCServerConfig returns the TLS configuration of a gRPC server: like ServerConfig, but it
// only asks for the client's certificate, and package authz verifies it (VerifyClient) in
// the server's interceptor, so that a refusal is a gRPC status that says why
// (Unauthenticated: no certificate, expired, another CA) and is counted per method, rather
// than a failed handshake the client reports as "connection closed".
func (s *Source) GRPCServerConfig() *tls.Config {
	return s.serverConfig(tls.RequestClientCert, "h2")
}

// serverConfig presents the certificate of the moment and asks for the client's as auth
// says.
func (s *Source) serverConfig(auth tls.ClientAuthType, protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.current()
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*m.cert},
				ClientCAs:    m.pool,
				ClientAuth:   auth,
				NextProtos:   protos,
			}, nil
		},
	}
}

// VerifyClient verifies a client's certificate chain against the current CAs and returns
// the identity it names.
//
// Every call on a connection presents the same parsed chain, so a chain verified against
// the CAs of the moment is remembered until it expires or the CAs change: verifying an ECDSA
// chain costs tens of microseconds, which a node's load reports would pay every second.
func (s *Source) VerifyClient(chain []*x509.Certificate) (Identity, error) {
	m := s.current()
	if id, ok := s.verified(m, chain); ok {
		return id, nil
	}
	id, err := verifyAgainst(m, chain, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return Identity{}, fmt.Errorf("mtls: the client certificate: %w", err)
	}
	s.remember(m, chain[0], id)
	return id, nil
}

// maxVerified bounds the chains remembered: about one per open connection. A relay or a
// leader serving 10,000 routers or members verified nearly every call at the former bound,
// 4,096 (40% of a leader's CPU under 10,000 members); an entry is about 100 bytes.
const maxVerified = 1 << 16

type verification struct {
	by *material // the CAs it was verified against
	id Identity
}

func (s *Source) verified(m *material, chain []*x509.Certificate) (Identity, bool) {
	if len(chain) == 0 {
		return Identity{}, false
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.cache[sha256.Sum256(chain[0].Raw)]
	if !ok || v.by != m || now.After(chain[0].NotAfter) || now.Before(chain[0].NotBefore) {
		return Identity{}, false
	}
	return v.id, true
}

func (s *Source) remember(m *material, leaf *x509.Certificate, id Identity) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil || len(s.cache) >= maxVerified {
		// Forgetting them all is simpler than an LRU, and costs one verification per
		// connection that calls again.
		s.cache = make(map[[sha256.Size]byte]verification)
	}
	// Keyed by the certificate's digest, not its parsed copy: an entry keeps no closed
	// connection's certificate alive.
	s.cache[sha256.Sum256(leaf.Raw)] = verification{by: m, id: id}
}
