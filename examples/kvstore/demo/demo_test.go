package demo

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
