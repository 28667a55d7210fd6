// Package certs makes a development certificate authority and the certificates of
// Sliceplane's identities with Go's crypto/x509, so that a laptop, the demo and the tests can
// run with mutual TLS without openssl. Production uses a real PKI (cert-manager in
// Kubernetes); see docs/SECURITY.md.
//
// Every certificate names its identity in a SPIFFE-style URI SAN,
// spiffe://<trust domain>/<kind>/<name> (spiffe://sliceplane/node/n2), which is what the
// servers authorize on (package mtls). Server certificates carry localhost and the loopback
// addresses too, plus any extra host names asked for, so that tools which check host names
// (curl, etcdctl, Prometheus) accept them.
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"software.sslmate.com/src/go-pkcs12"
)

// ErrInvalid marks a request for a certificate that cannot be made (a bad name).
var ErrInvalid = errors.New("certs: invalid request")

// Defaults.
const (
	// DefaultTrustDomain is the trust domain of the identities Sliceplane makes and expects.
	DefaultTrustDomain = "sliceplane"
	// DefaultValidity is how long a development certificate is valid.
	DefaultValidity = 365 * 24 * time.Hour
)

// CA is a certificate authority that can sign certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Leaf is a certificate with its key, both PEM-encoded, ready to write.
type Leaf struct {
	CertPEM []byte
	KeyPEM  []byte
	Cert    *x509.Certificate
}

// Request describes one certificate to make.
type Request struct {
	// TrustDomain is the SPIFFE trust domain; empty means DefaultTrustDomain.
	TrustDomain string
	// Kind is the identity's kind (node, distributor, router, viewer, admin, assigner).
	Kind string
	// Name is the identity's name within its kind: a node's id, a person's login.
	Name string
	// Target, if set, confines the identity to one target:
	// spiffe://<trust domain>/target/<target>/<kind>/<name>.
	Target string
	// Hosts are extra DNS names or IP addresses the certificate is valid for as a server.
	Hosts []string
	// NotBefore and NotAfter bound its validity; zero means now-1h and now+DefaultValidity.
	NotBefore, NotAfter time.Time
}

// NewCA makes a self-signed certificate authority named name, valid for validity.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generating the CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Sliceplane development"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: signing the CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: parsing the CA: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// CertPEM returns the CA's certificate, PEM-encoded: the file every process trusts.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// KeyPEM returns the CA's private key, PEM-encoded.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certs: encoding the CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ID returns the SPIFFE ID of the identity r asks for.
func (r Request) ID() string {
	domain, path := r.TrustDomain, "/"+r.Kind+"/"+r.Name
	if domain == "" {
		domain = DefaultTrustDomain
	}
	if r.Target != "" {
		path = "/target/" + r.Target + path
	}
	return (&url.URL{Scheme: "spiffe", Host: domain, Path: path}).String()
}

// base is the name of the files of r's certificate: <kind>-<name>, or
// target-<target>-<kind>-<name> for an identity confined to a target.
func (r Request) base() string {
	if r.Target != "" {
		return "target-" + r.Target + "-" + r.Kind + "-" + r.Name
	}
	return r.Kind + "-" + r.Name
}

// Issue signs a certificate for r, usable by a client and a server alike.
func (ca *CA) Issue(r Request) (*Leaf, error) {
	if err := checkName("kind", r.Kind); err != nil {
		return nil, err
	}
	if err := checkName("name", r.Name); err != nil {
		return nil, err
	}
	if r.Target != "" {
		if err := checkName("target", r.Target); err != nil {
			return nil, err
		}
	}
	id, err := url.Parse(r.ID())
	if err != nil {
		return nil, fmt.Errorf("%w: %s/%s: %v", ErrInvalid, r.Kind, r.Name, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generating a key for %s: %w", id, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: strings.TrimPrefix(id.Path, "/")},
		NotBefore:    orTime(r.NotBefore, now.Add(-time.Hour)),
		NotAfter:     orTime(r.NotAfter, now.Add(DefaultValidity)),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range r.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certs: signing %s: %w", id, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: parsing %s: %w", id, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: encoding the key of %s: %w", id, err)
	}
	return &Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		Cert:    cert,
	}, nil
}

// Files are the paths of one identity's files as WriteLeaf lays them out.
type Files struct {
	Cert, Key, CA string
}

// WriteCA writes ca.crt and ca.key into dir (created if missing); it refuses to overwrite an
// existing CA, whose certificates would all stop being trusted.
func WriteCA(dir string, ca *CA) error {
	key, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := writeNew(filepath.Join(dir, "ca.crt"), ca.CertPEM(), 0o644); err != nil {
		return err
	}
	return writeNew(filepath.Join(dir, "ca.key"), key, 0o600)
}

// LoadCA reads the CA WriteCA wrote into dir.
func LoadCA(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%w: %s holds no PEM CA certificate and key", ErrInvalid, dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certs: parsing %s/ca.crt: %w", dir, err)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certs: parsing %s/ca.key: %w", dir, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, fmt.Errorf("%w: %s/ca.crt is not a CA with a signing key", ErrInvalid, dir)
	}
	return &CA{Cert: cert, Key: signer}, nil
}

// WriteLeaf writes l as <kind>-<name>.crt and .key into dir, next to ca.crt, and returns the
// three paths. Existing files are replaced (atomically), which is how a rotation looks to a
// running process.
func WriteLeaf(dir string, r Request, l *Leaf) (Files, error) {
	base := filepath.Join(dir, r.base())
	f := Files{Cert: base + ".crt", Key: base + ".key", CA: filepath.Join(dir, "ca.crt")}
	if err := WriteAtomic(f.Key, l.KeyPEM, 0o600); err != nil {
		return Files{}, err
	}
	if err := WriteAtomic(f.Cert, l.CertPEM, 0o644); err != nil {
		return Files{}, err
	}
	return f, nil
}

// PKCS12Password is the password of the PKCS#12 files WritePKCS12 writes: none. A password
// would protect nothing the .key beside the file leaves open (unencrypted PEM, with the same
// owner-only mode), and NSS (the certificate store of Firefox, and of Chromium on Linux) and
// OpenSSL import the file given an empty one. docs/SECURITY.md says how to make a file with
// a password, for one that travels.
const PKCS12Password = ""

// EncodePKCS12 encodes l's certificate and key, with the certificate of ca that signed it,
// as one PKCS#12 file protected by password: the form in which a browser imports a client
// certificate. Its encryption is PBES2 with AES-256 and its MAC HMAC-SHA-256, which NSS and
// OpenSSL 1.1.1 and later read; not the legacy RC2 (which OpenSSL 3 reads only with its
// legacy provider) or 3DES.
func EncodePKCS12(l *Leaf, ca *x509.Certificate, password string) ([]byte, error) {
	kb, _ := pem.Decode(l.KeyPEM)
	if kb == nil {
		return nil, fmt.Errorf("%w: the key of %s is not PEM", ErrInvalid, l.Cert.Subject.CommonName)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certs: parsing the key of %s: %w", l.Cert.Subject.CommonName, err)
	}
	data, err := pkcs12.Modern.Encode(key, l.Cert, []*x509.Certificate{ca}, password)
	if err != nil {
		return nil, fmt.Errorf("certs: encoding %s as PKCS#12: %w", l.Cert.Subject.CommonName, err)
	}
	return data, nil
}

// WritePKCS12 writes l, with ca's certificate, as <kind>-<name>.p12 into dir, next to the
// .crt and .key of WriteLeaf, and returns its path. The file holds the private key, so only
// its owner reads it; an existing one is replaced (atomically), like WriteLeaf's.
func WritePKCS12(dir string, r Request, l *Leaf, ca *x509.Certificate) (string, error) {
	data, err := EncodePKCS12(l, ca, PKCS12Password)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, r.base()+".p12")
	if err := WriteAtomic(path, data, 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// WriteAtomic replaces path with data through a rename, so a reader sees the old file or
// the new one, never half of it.
func WriteAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close() //nolint:errcheck,gosec // the write error is the one to report
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close() //nolint:errcheck,gosec // the chmod error is the one to report
		return fmt.Errorf("certs: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}

func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close() //nolint:errcheck,gosec // the write error is the one to report
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	return nil
}

// checkName keeps names to what reads well in a URI path and a file name.
func checkName(what, s string) error {
	if s == "" || len(s) > 128 {
		return fmt.Errorf("%w: %s %q must have 1 to 128 characters", ErrInvalid, what, s)
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'
		if !ok {
			return fmt.Errorf("%w: %s %q may hold only letters, digits, '-', '_' and '.'", ErrInvalid, what, s)
		}
	}
	if s == "." || s == ".." {
		return fmt.Errorf("%w: %s %q is not a name", ErrInvalid, what, s)
	}
	return nil
}

func orTime(t, def time.Time) time.Time {
	if t.IsZero() {
		return def
	}
	return t
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("certs: the system's random source failed: %v", err))
	}
	return n
}
