package mtls

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// TrustDomain is the SPIFFE trust domain of Sliceplane's identities.
const TrustDomain = "sliceplane"

// ErrNoIdentity marks a certificate that names no Sliceplane identity.
var ErrNoIdentity = errors.New("mtls: no sliceplane identity")

// Identity is who a certificate says its holder is: the URI SAN
// spiffe://sliceplane/<kind>/<name>, e.g. spiffe://sliceplane/node/n2. The kind is the role
// the identity has by default (package authz); the name is a node's id or a person's login.
type Identity struct {
	ID   string
	Kind string
	Name string
}

// String returns the SPIFFE ID.
func (i Identity) String() string { return i.ID }

// IdentityOf returns the identity a certificate names in its one spiffe:// URI SAN of the
// sliceplane trust domain.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	if cert == nil {
		return Identity{}, fmt.Errorf("%w: no certificate", ErrNoIdentity)
	}
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != TrustDomain {
			continue
		}
		parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
		if len(parts) != 2 || parts[0] == "" || parts[1] == "" || u.RawQuery != "" || u.Fragment != "" {
			return Identity{}, fmt.Errorf("%w: %s is not spiffe://%s/<kind>/<name>", ErrNoIdentity, u, TrustDomain)
		}
		found = append(found, Identity{ID: u.String(), Kind: parts[0], Name: parts[1]})
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return Identity{}, fmt.Errorf("%w: the certificate of %q has no spiffe://%s/ URI SAN", ErrNoIdentity, cert.Subject.CommonName, TrustDomain)
	}
	return Identity{}, fmt.Errorf("%w: the certificate of %q names %d identities; it must name one", ErrNoIdentity, cert.Subject.CommonName, len(found))
}
