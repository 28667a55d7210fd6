// Package mtlstest makes a throwaway CA and certificates in a test's temporary directory.
package mtlstest

import (
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// PKI is a development CA whose files live in Dir.
type PKI struct {
	Dir string
	CA  *certs.CA
	t   testing.TB
}

// New makes a CA in a new temporary directory.
func New(t testing.TB) *PKI {
	t.Helper()
	ca, err := certs.NewCA("sliceplane test CA", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := certs.WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	return &PKI{Dir: dir, CA: ca, t: t}
}

// Config issues (or re-issues, replacing the files) a certificate for kind/name and returns
// the flags of a process that uses it.
func (p *PKI) Config(kind, name string) mtls.Config {
	return p.Issue(certs.Request{Kind: kind, Name: name})
}

// Issue issues a certificate for r and returns the flags of a process that uses it.
func (p *PKI) Issue(r certs.Request) mtls.Config {
	p.t.Helper()
	leaf, err := p.CA.Issue(r)
	if err != nil {
		p.t.Fatal(err)
	}
	f, err := certs.WriteLeaf(p.Dir, r, leaf)
	if err != nil {
		p.t.Fatal(err)
	}
	return mtls.Config{Cert: f.Cert, Key: f.Key, CA: f.CA}
}

// Source issues a certificate for kind/name and loads it.
func (p *PKI) Source(kind, name string) *mtls.Source {
	p.t.Helper()
	s, err := p.Config(kind, name).Load()
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}
