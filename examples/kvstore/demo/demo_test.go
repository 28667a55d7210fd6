package demo

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"software.sslmate.com/src/go-pkcs12"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	"github.com/sliceplane/sliceplane/examples/kvstore/loadgen"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

func TestRatesAndImbalanceOverAWindow(t *testing.T) {
	history := []loadgen.Stats{
		{Reads: 0, Served: map[string]uint64{}},
		{Reads: 100, Served: map[string]uint64{"n1": 90, "n2": 10}},
		{Reads: 200, Served: map[string]uint64{"n1": 140, "n2": 60}},
		{Reads: 300, Served: map[string]uint64{"n1": 190, "n2": 110}},
	}
	last, total := rates(history, 1)
	if last["n1"] != 50 || last["n2"] != 50 || total != 100 {
		t.Errorf("last second: %v, %v reads/s", last, total)
	}
	// The window is cut to the history there is.
	all, total := rates(history, 10)
	if math.Abs(all["n1"]-190.0/3) > 1e-9 || total != 100 {
		t.Errorf("whole history: %v, %v reads/s", all, total)
	}
	if got := imbalance(last, []string{"n1", "n2"}); got != 1 {
		t.Errorf("even load: imbalance %v, want 1", got)
	}
	// A node that served nothing counts in the mean.
	if got := imbalance(last, []string{"n1", "n2", "n3", "n4"}); got != 2 {
		t.Errorf("two idle nodes of four: imbalance %v, want 2", got)
	}
	if got := imbalance(nil, []string{"n1"}); got != 0 {
		t.Errorf("no load: imbalance %v, want 0", got)
	}
	if r, _ := rates(history[:1], 5); r != nil {
		t.Errorf("one sample: rates %v, want none", r)
	}
}

func TestSummaryLine(t *testing.T) {
	if got, want := (Summary{Imbalance: 1.034, Items: 10000}).String(), "final imbalance=1.03 items=10000 lost=0 misses=0 failed=0"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if got, want := (Summary{Imbalance: 1.5, Items: 9, Lost: 1, Stale: 2, Misses: 3, Failed: 4}).String(),
		"final imbalance=1.50 items=9 lost=1 misses=3 failed=4 leaked=0 stale=2"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

// The environment file the demo prints sets slicectl's TLS variables to an admin's files,
// which load as that identity.
func TestSlicectlEnvNamesAnAdminsFiles(t *testing.T) {
	dir := t.TempDir()
	pki, err := launch.NewPKI(filepath.Join(dir, "pki"), 0)
	if err != nil {
		t.Fatal(err)
	}
	d := &demo{cfg: Config{Dir: dir}, pki: pki}
	path, err := d.slicectlEnv()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || !strings.HasPrefix(line, "export ") {
			t.Fatalf("line %q is not an export", line)
		}
		env[k] = v
	}
	cfg := mtls.Config{Cert: env["SLICEPLANE_TLS_CERT"], Key: env["SLICEPLANE_TLS_KEY"], CA: env["SLICEPLANE_TLS_CA"]}
	src, err := cfg.Load()
	if err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if id := src.Identity(); id.Kind != "admin" {
		t.Errorf("identity %s, want an admin", id)
	}
	if len(env) != 3 {
		t.Errorf("%d variables, want 3:\n%s", len(env), b)
	}
	if d.mode() != "mTLS on" || (&demo{}).mode() != "plaintext" {
		t.Errorf("modes %q and %q", d.mode(), (&demo{}).mode())
	}
}

// The intro has a line beginning "web:" with the assigner's web view, on its metrics address,
// and, with mutual TLS, the admin's PKCS#12 file to import, which is there and decodes with
// the empty password the line promises.
func TestIntroNamesTheWebViewAndTheAdminsPKCS12(t *testing.T) {
	assigner := &kvcluster.Member{Kind: "assigner", ID: "a1", Metrics: "127.0.0.1:7071"}
	for _, secured := range []bool{true, false} {
		dir := t.TempDir()
		var pki *launch.PKI
		if secured {
			var err error
			if pki, err = launch.NewPKI(filepath.Join(dir, "pki"), 0); err != nil {
				t.Fatal(err)
			}
		}
		cluster, err := kvcluster.New(kvcluster.Options{Dir: dir, PKI: pki})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		d := &demo{cfg: Config{Dir: dir}, out: &out, pki: pki, cluster: cluster}
		if err := d.endpoints([]*kvcluster.Member{assigner}); err != nil {
			t.Fatal(err)
		}
		web := webLine(t, out.String())
		p12 := filepath.Join(dir, "pki", "admin-demo.p12")
		if !secured {
			if web != "web:         http://127.0.0.1:7071/ui/" {
				t.Errorf("plaintext: %q", web)
			}
			continue
		}
		if !strings.HasPrefix(web, "web:         https://127.0.0.1:7071/ui/  (import "+p12+" into the browser, empty password") {
			t.Errorf("mTLS: %q", web)
		}
		checkP12(t, p12)
	}
}

// webLine returns the one line of out that begins "web:".
func webLine(t *testing.T, out string) string {
	t.Helper()
	var found []string
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, "web:") {
			found = append(found, line)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d lines begin with web:, want 1:\n%s", len(found), out)
	}
	return found[0]
}

// checkP12 checks that path decodes with the empty password into an admin's certificate
// and the CA.
func checkP12(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, cert, chain, err := pkcs12.DecodeChain(data, "")
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if id, err := mtls.IdentityOf(cert); err != nil || id.Kind != "admin" || len(chain) != 1 {
		t.Errorf("%s holds %v (%v) and %d CA certificates; want an admin and the CA", path, id, err, len(chain))
	}
}
