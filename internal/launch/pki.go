package launch

import (
	"fmt"
	"sync"
	"time"

	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// PKI is a throwaway certificate authority in a directory, which issues the certificates of
// the processes a launcher starts. A nil *PKI issues nothing: every process runs plaintext,
// so a launcher can take "secured or not" as one value.
type PKI struct {
	Dir string

	mu     sync.Mutex
	ca     *certs.CA
	issued map[string]mtls.Config
}

// NewPKI makes a CA valid for validity (a day when 0) and writes it into dir.
func NewPKI(dir string, validity time.Duration) (*PKI, error) {
	if validity == 0 {
		validity = 24 * time.Hour
	}
	ca, err := certs.NewCA("sliceplane throwaway CA", validity)
	if err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	if err := certs.WriteCA(dir, ca); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	return &PKI{Dir: dir, ca: ca, issued: map[string]mtls.Config{}}, nil
}

// Issue returns the TLS files of identity kind/name, issuing its certificate at first use
// (a restarted process keeps its files). A nil PKI returns the zero Config: plaintext.
func (p *PKI) Issue(kind, name string) (mtls.Config, error) {
	if p == nil {
		return mtls.Config{}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	key := kind + "/" + name
	if c, ok := p.issued[key]; ok {
		return c, nil
	}
	req := certs.Request{Kind: kind, Name: name}
	leaf, err := p.ca.Issue(req)
	if err != nil {
		return mtls.Config{}, fmt.Errorf("launch: %w", err)
	}
	f, err := certs.WriteLeaf(p.Dir, req, leaf)
	if err != nil {
		return mtls.Config{}, fmt.Errorf("launch: %w", err)
	}
	c := mtls.Config{Cert: f.Cert, Key: f.Key, CA: f.CA}
	p.issued[key] = c
	return c, nil
}

// Source issues the certificate of kind/name and loads it, for the launcher's own clients;
// nil (plaintext) for a nil PKI.
func (p *PKI) Source(kind, name string) (*mtls.Source, error) {
	c, err := p.Issue(kind, name)
	if err != nil {
		return nil, err
	}
	src, err := c.Load()
	if err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	return src, nil
}

// Args issues the certificate of kind/name and returns the flags that give it to a process:
// --tls-cert, --tls-key and --tls-ca, or none for a nil PKI.
func (p *PKI) Args(kind, name string) ([]string, error) {
	c, err := p.Issue(kind, name)
	if err != nil {
		return nil, err
	}
	return TLSArgs(c), nil
}

// TLSArgs returns the flags of c, the same on every binary; none for the zero Config.
func TLSArgs(c mtls.Config) []string {
	if !c.Enabled() {
		return nil
	}
	return []string{"--tls-cert", c.Cert, "--tls-key", c.Key, "--tls-ca", c.CA}
}
