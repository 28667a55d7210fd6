package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"software.sslmate.com/src/go-pkcs12"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	"github.com/sliceplane/sliceplane/internal/assigner/core"
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
		assigners: []*kvcluster.Member{{Kind: "assigner", ID: "a1", Addr: "127.0.0.1:7070", Metrics: "127.0.0.1:7071"}}}
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

// The counter's settings are one config: the flags of a control plane of its own, the same
// as before targets, and the config of its target in a shared one, which the assigners
// apply over their flags.
func TestTheCountersSettingsAsFlagsAndAsATarget(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		flags string
		ttl   time.Duration
	}{
		{Config{}, "--roles primary-secondary --exclusive", 10 * time.Second},
		{Config{Pause: true}, "--roles primary-secondary --exclusive --node-ttl 3s", pauseTTL},
		{Config{Inclusive: true, Pause: true}, "--roles primary-secondary --node-ttl 3s", pauseTTL},
	} {
		target := TargetConfig(tc.cfg)
		if got := strings.Join(flagsOf(target), " "); got != tc.flags {
			t.Errorf("%+v: flags %q, want %q", tc.cfg, got, tc.flags)
		}
		applied, err := target.Apply(core.Config{})
		if err != nil {
			t.Fatalf("%+v: %v", tc.cfg, err)
		}
		if applied.Roles != "primary-secondary" || applied.Exclusive != !tc.cfg.Inclusive || applied.NodeTTL != tc.ttl {
			t.Errorf("%+v: the target's config applies as roles %s, exclusive %v, node TTL %s", tc.cfg, applied.Roles,
				applied.Exclusive, applied.NodeTTL)
		}
	}
}
