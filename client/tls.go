package client

import (
	"crypto/tls"
	"fmt"

	"google.golang.org/grpc"

	"github.com/sliceplane/sliceplane/internal/mtls"
)

// TLS names the PEM files of a client's mutual TLS: its certificate and key (whose URI SAN
// names it, spiffe://sliceplane/node/<id> for a node) and the CA it trusts. The files are
// re-read when they change, so certificates rotate without a restart. The zero TLS means
// plaintext, which only a server on loopback (or one run with --insecure) accepts.
//
// A client verifies its server's certificate against CA and checks the kind of identity it
// names (an assigner, a distributor), not its host name.
type TLS struct {
	Cert, Key, CA string
}

// ErrTLS is wrapped by the errors about TLS settings that cannot be used: files missing
// or not loading, or a node's certificate that names another identity.
var ErrTLS = mtls.ErrConfig

// IsZero reports whether t names no file: plaintext.
func (t TLS) IsZero() bool { return t == TLS{} }

// load returns the Source of t's files, nil for the zero TLS. All three files are needed.
func (t TLS) load() (*mtls.Source, error) {
	src, err := mtls.Config{Cert: t.Cert, Key: t.Key, CA: t.CA}.Load()
	if err != nil {
		return nil, fmt.Errorf("client: TLS: %w", err)
	}
	return src, nil
}

// ClientConfig returns the *tls.Config of a client with t's certificate, re-reading the
// files when they change: for an etcd client (clientv3.Config.TLS, with https endpoints)
// that writes the data source, or an HTTPS client of a metrics endpoint. It returns nil for
// the zero TLS. The server's certificate must name a Sliceplane identity
// (spiffe://sliceplane/<kind>/<name>) and chain to CA.
func (t TLS) ClientConfig() (*tls.Config, error) {
	src, err := t.load()
	if err != nil {
		return nil, err
	}
	return src.ClientTLS(), nil
}

// ServerConfig returns the *tls.Config of a member's own service (HTTPS, or gRPC through
// credentials.NewTLS) with t's certificate: it requires a client certificate that chains to
// CA (a router's, or any identity the CA issued), re-reading the files when they change. It
// returns nil for the zero TLS: serve plaintext then, on loopback only.
func (t TLS) ServerConfig() (*tls.Config, error) {
	src, err := t.load()
	if err != nil || src == nil {
		return nil, err
	}
	return src.ServerConfig(), nil
}

// MemberDialOption returns the transport credentials of a caller of members, with t's
// certificate: for a ClientConn made with GRPCDialOptions, or any client of a member's
// service. It checks that the server's certificate names a member (a node identity,
// spiffe://sliceplane/node/<id>) and chains to CA. Plaintext for the zero TLS.
func (t TLS) MemberDialOption() (grpc.DialOption, error) {
	src, err := t.load()
	if err != nil {
		return nil, err
	}
	return src.DialOption(memberKind), nil
}

// memberKind is the kind of identity a member's certificate names: a node's.
const memberKind = "node"
