// Package mtls holds the mutual TLS of every Sliceplane link: the certificate, key and CA a
// process is given (--tls-cert, --tls-key, --tls-ca, the same names on every binary), the
// TLS configurations of its servers and clients, and the rule that keeps plaintext off the
// network (closed by default).
//
// Files are re-read when they change (checked at most once a CheckInterval, on the next
// handshake), so certificates rotate without a restart: connections already open keep the
// certificates they were made with, new ones use the new files. A file that fails to load
// (a rotation half written) leaves the last good certificates in use.
//
// Identities are SPIFFE-style URI SANs, spiffe://sliceplane/<kind>/<name>; see Identity.
// Servers require a client certificate from the CA; clients verify the server's chain and
// its identity (kind), not its host name, since a pod's address says nothing about who runs
// there. Package authz decides what each identity may call.
package mtls

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ErrConfig marks TLS flags that do not go together or files that do not load.
var ErrConfig = errors.New("mtls: bad TLS configuration")

// Config is what a process is told about its TLS: the flags of every binary, the fields of
// its --config file and of the Go client's options.
type Config struct {
	// Cert and Key are the PEM files of the process's own certificate and private key.
	Cert string `yaml:"tls-cert"`
	Key  string `yaml:"tls-key"`
	// CA is the PEM file of the certificate authorities it trusts, for peers in both
	// directions.
	CA string `yaml:"tls-ca"`
	// Insecure lets a server listen without TLS on an address other than loopback.
	Insecure bool `yaml:"insecure"`
}

// AddFlags registers --tls-cert, --tls-key, --tls-ca and, for binaries that serve,
// --insecure.
func (c *Config) AddFlags(fs *pflag.FlagSet, serves bool) {
	fs.StringVar(&c.Cert, "tls-cert", c.Cert, "PEM certificate of this process (mutual TLS; with --tls-key and --tls-ca)")
	fs.StringVar(&c.Key, "tls-key", c.Key, "PEM private key of --tls-cert")
	fs.StringVar(&c.CA, "tls-ca", c.CA, "PEM certificate authorities to trust for every peer")
	if serves {
		fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "allow listening without TLS on a non-loopback address (never in production)")
	}
}

// Enabled reports whether TLS files were given.
func (c Config) Enabled() bool { return c.Cert != "" || c.Key != "" || c.CA != "" }

// Validate checks that the files come as a set of three and can be read, and that
// --insecure is not given together with them.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	var missing []string
	for _, f := range []struct{ flag, path string }{{"--tls-cert", c.Cert}, {"--tls-key", c.Key}, {"--tls-ca", c.CA}} {
		if f.path == "" {
			missing = append(missing, f.flag)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s missing: TLS needs --tls-cert, --tls-key and --tls-ca together", ErrConfig, strings.Join(missing, ", "))
	}
	if c.Insecure {
		return fmt.Errorf("%w: --insecure goes with no TLS files, not with --tls-cert", ErrConfig)
	}
	for _, p := range []string{c.Cert, c.Key, c.CA} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	return nil
}

// Load validates c and loads its files; it returns a nil *Source, which means plaintext,
// when c gives none.
func (c Config) Load() (*Source, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !c.Enabled() {
		return nil, nil
	}
	return newSource(c)
}

// Mode says in a word how a process's links are secured, for logs and the demo's view.
func (s *Source) Mode() string {
	if s == nil {
		return "plaintext"
	}
	return "mTLS"
}

// ServerCredentials returns the transport credentials of a gRPC server: mutual TLS, or
// plaintext for a nil Source.
func (s *Source) ServerCredentials() credentials.TransportCredentials {
	if s == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(s.GRPCServerConfig())
}

// ServerOption returns the grpc.Creds option of ServerCredentials.
func (s *Source) ServerOption() grpc.ServerOption { return grpc.Creds(s.ServerCredentials()) }

// DialOption returns the transport credentials of a gRPC client that expects a server of
// one of kinds (any identity of the trust domain when none is named), or plaintext for a nil
// Source.
func (s *Source) DialOption(kinds ...string) grpc.DialOption {
	if s == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(s.ClientConfig(kinds...)))
}

// ServerTLS returns the *tls.Config of an HTTP server, nil for a nil Source.
func (s *Source) ServerTLS() *tls.Config {
	if s == nil {
		return nil
	}
	return s.ServerConfig()
}

// ClientTLS returns the *tls.Config of an HTTP or etcd client, nil for a nil Source.
func (s *Source) ClientTLS(kinds ...string) *tls.Config {
	if s == nil {
		return nil
	}
	return s.ClientConfig(kinds...)
}
