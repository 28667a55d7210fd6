package mtls

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// TrustDomain is the SPIFFE trust domain of Sliceplane's identities.
const TrustDomain = "sliceplane"

// ErrNoIdentity marks a certificate that names no Sliceplane identity.
var ErrNoIdentity = errors.New("mtls: no sliceplane identity")

// Identity is who a certificate says its holder is: the URI SAN
// spiffe://sliceplane/<kind>/<name>, e.g. spiffe://sliceplane/node/n2, or, for an identity
// confined to one target (one sharded service of the control plane),
// spiffe://sliceplane/target/<target>/<kind>/<name>. The kind is the role the identity has
// by default (package authz); the name is a node's id or a person's login.
type Identity struct {
	ID     string
	Kind   string
	Name   string
	Target string // "" for an identity no target confines
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
		id, ok := parseIdentity(u.Path)
		if !ok || u.RawQuery != "" || u.Fragment != "" {
			return Identity{}, fmt.Errorf("%w: %s is not spiffe://%s/<kind>/<name> nor spiffe://%s/target/<target>/<kind>/<name>",
				ErrNoIdentity, u, TrustDomain, TrustDomain)
		}
		id.ID = u.String()
		found = append(found, id)
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return Identity{}, fmt.Errorf("%w: the certificate of %q has no spiffe://%s/ URI SAN", ErrNoIdentity, cert.Subject.CommonName, TrustDomain)
	}
	return Identity{}, fmt.Errorf("%w: the certificate of %q names %d identities; it must name one", ErrNoIdentity, cert.Subject.CommonName, len(found))
}

// parseIdentity reads the path of a SPIFFE ID: /<kind>/<name> or /target/<t>/<kind>/<name>.
func parseIdentity(path string) (Identity, bool) {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if slices.Contains(parts, "") {
		return Identity{}, false
	}
	switch {
	case len(parts) == 2:
		return Identity{Kind: parts[0], Name: parts[1]}, true
	case len(parts) == 4 && parts[0] == "target":
		return Identity{Target: parts[1], Kind: parts[2], Name: parts[3]}, true
	}
	return Identity{}, false
}

// ParseID reads a SPIFFE ID of the sliceplane trust domain.
func ParseID(s string) (Identity, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrNoIdentity, err)
	}
	id, ok := parseIdentity(u.Path)
	if u.Scheme != "spiffe" || u.Host != TrustDomain || !ok || u.RawQuery != "" || u.Fragment != "" {
		return Identity{}, fmt.Errorf("%w: %s is not spiffe://%s/<kind>/<name> nor spiffe://%s/target/<target>/<kind>/<name>",
			ErrNoIdentity, s, TrustDomain, TrustDomain)
	}
	id.ID = s
	return id, nil
}
