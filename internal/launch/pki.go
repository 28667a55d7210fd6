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
	issued map[string]issued
}

// issued is one identity's certificate, kept with its key for the PKCS#12 file.
type issued struct {
	req   certs.Request
	leaf  *certs.Leaf
	files mtls.Config
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
	return &PKI{Dir: dir, ca: ca, issued: map[string]issued{}}, nil
}

// Issue returns the TLS files of identity kind/name, issuing its certificate at first use
// (a restarted process keeps its files). A nil PKI returns the zero Config: plaintext.
func (p *PKI) Issue(kind, name string) (mtls.Config, error) {
	return p.IssueOf(certs.Request{Kind: kind, Name: name})
}

// IssueOf is Issue for the identity req names, confined to a target when req.Target is set.
func (p *PKI) IssueOf(req certs.Request) (mtls.Config, error) {
	if p == nil {
		return mtls.Config{}, nil
	}
	is, err := p.issue(req)
	return is.files, err
}

func (p *PKI) issue(req certs.Request) (issued, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := req.ID()
	if is, ok := p.issued[key]; ok {
		return is, nil
	}
	leaf, err := p.ca.Issue(req)
	if err != nil {
		return issued{}, fmt.Errorf("launch: %w", err)
	}
	f, err := certs.WriteLeaf(p.Dir, req, leaf)
	if err != nil {
		return issued{}, fmt.Errorf("launch: %w", err)
	}
	is := issued{req: req, leaf: leaf, files: mtls.Config{Cert: f.Cert, Key: f.Key, CA: f.CA}}
	p.issued[key] = is
	return is, nil
}

// PKCS12 writes the certificate of kind/name (issued at first use), its key and the CA as
// <kind>-<name>.p12 beside its other files, and returns the path: the file a person imports
// into a browser, with an empty password (certs.PKCS12Password). A nil PKI writes nothing.
func (p *PKI) PKCS12(kind, name string) (string, error) {
	if p == nil {
		return "", nil
	}
	is, err := p.issue(certs.Request{Kind: kind, Name: name})
	if err != nil {
		return "", err
	}
	path, err := certs.WritePKCS12(p.Dir, is.req, is.leaf, p.ca.Cert)
	if err != nil {
		return "", fmt.Errorf("launch: %w", err)
	}
	return path, nil
}

// WebLine returns a launcher's line on the assigner's web view, served under /ui/ on its
// metrics address addr: with a PKI, the https URL and the PKCS#12 file of admin/name, written
// for the purpose, to import into the browser (the view requires a client certificate);
// with a nil PKI, the http URL alone. The line begins "web:" so that a reader (or a script)
// finds it in the intro.
func (p *PKI) WebLine(addr, admin string) (string, error) {
	if p == nil {
		return "web:         http://" + addr + "/ui/", nil
	}
	p12, err := p.PKCS12("admin", admin)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("web:         https://%s/ui/  (import %s into the browser, empty password; see docs/SECURITY.md)",
		addr, p12), nil
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
	return p.ArgsOf(certs.Request{Kind: kind, Name: name})
}

// ArgsOf is Args for the identity req names.
func (p *PKI) ArgsOf(req certs.Request) ([]string, error) {
	c, err := p.IssueOf(req)
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
