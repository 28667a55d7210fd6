package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"software.sslmate.com/src/go-pkcs12"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// The intro has a line beginning "web:" with the assigner's web view, on its metrics address,
// and the admin's PKCS#12 file to import, which is there and decodes with the empty password
// the line promises into an admin's certificate and the CA.
func TestIntroNamesTheWebViewAndTheAdminsPKCS12(t *testing.T) {
	dir := t.TempDir()
	pki, err := launch.NewPKI(filepath.Join(dir, "pki"), 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	d := &demo{cfg: Config{Dir: dir, Members: 3, Out: &out}, pki: pki, proxy: "http://127.0.0.1:8080",
		assigner: &kvcluster.Member{Kind: "assigner", ID: "a1", Addr: "127.0.0.1:7070", Metrics: "127.0.0.1:7071"}}
	if err := d.intro(); err != nil {
		t.Fatal(err)
	}
	var web []string
	for line := range strings.SplitSeq(out.String(), "\n") {
		if strings.HasPrefix(line, "web:") {
			web = append(web, line)
		}
	}
	p12 := filepath.Join(dir, "pki", "admin-demo.p12")
	want := "web:         https://127.0.0.1:7071/ui/  (import " + p12 + " into the browser, empty password"
	if len(web) != 1 || !strings.HasPrefix(web[0], want) {
		t.Fatalf("lines beginning web: %q, want one beginning %q:\n%s", web, want, out.String())
	}
	if !strings.Contains(out.String(), "--assigner 127.0.0.1:7070 --tls-cert ") {
		t.Errorf("no slicectl line for the assigner:\n%s", out.String())
	}
	data, err := os.ReadFile(p12)
	if err != nil {
		t.Fatal(err)
	}
	_, cert, chain, err := pkcs12.DecodeChain(data, "")
	if err != nil {
		t.Fatalf("%s: %v", p12, err)
	}
	if id, err := mtls.IdentityOf(cert); err != nil || id.Kind != "admin" || id.Name != "demo" || len(chain) != 1 {
		t.Errorf("%s holds %v (%v) and %d CA certificates; want admin/demo and the CA", p12, id, err, len(chain))
	}
}
