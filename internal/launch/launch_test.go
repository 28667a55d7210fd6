package launch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"software.sslmate.com/src/go-pkcs12"

	"github.com/sliceplane/sliceplane/internal/mtls"
)

func TestMain(m *testing.M) {
	helper()
	goleak.VerifyTestMain(m)
}

// A shell that exits cleanly on SIGTERM, as Sliceplane's binaries do.
var polite = []string{"-c", `trap 'echo bye; exit 0' TERM; echo hello; while :; do sleep 0.05; done`}

func TestStopIsCleanAndLogged(t *testing.T) {
	p, err := Start("polite", "/bin/sh", polite, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := WaitFor(ctx, "hello", 10*time.Millisecond, func(context.Context) error {
		if !strings.Contains(p.Tail(5), "\nhello") { // the first line, the command, says hello too
			return errors.New("not yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if done, err := p.Exited(); done || err != nil {
		t.Fatalf("running process: exited %v, %v", done, err)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Tail(1), "bye") {
		t.Errorf("log ends %q, want the goodbye", p.Tail(3))
	}
	if done, err := p.Exited(); !done || err != nil {
		t.Errorf("stopped process: exited %v, %v; want a clean exit", done, err)
	}
}

func TestKillAndUnaskedExits(t *testing.T) {
	dir := t.TempDir()
	p, err := Start("stubborn", "/bin/sh", []string{"-c", `trap '' TERM; echo ready; while :; do sleep 0.05; done`}, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := WaitFor(ctx, "ready", 10*time.Millisecond, func(context.Context) error {
		if !strings.Contains(p.Tail(5), "\nready") {
			return errors.New("not yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(200 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Stop of a process ignoring SIGTERM = %v, want it killed and reported", err)
	}
	q, err := Start("crash", "/bin/sh", []string{"-c", "exit 3"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	<-q.Done()
	if done, err := q.Exited(); !done || err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("a process that exits by itself: %v, %v; want its status reported", done, err)
	}
	if _, err := Start("missing", dir+"/no-such-binary", nil, dir); err == nil {
		t.Error("starting a missing binary: want an error")
	}
}

func TestWaitForEndsOnPermanentErrorsAndDeadlines(t *testing.T) {
	calls := 0
	err := WaitFor(context.Background(), "x", time.Millisecond, func(context.Context) error {
		calls++
		return Permanent(errors.New("gone"))
	})
	if calls != 1 || err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("permanent error: %d calls, %v", calls, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = WaitFor(ctx, "y", time.Millisecond, func(context.Context) error { return errors.New("not yet") })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "not yet") {
		t.Errorf("deadline: %v", err)
	}
}

func TestFreeAddrsAreDistinct(t *testing.T) {
	addrs, err := FreeAddrs(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] || !strings.HasPrefix(a, "127.0.0.1:") {
			t.Errorf("address %s repeated or not loopback: %v", a, addrs)
		}
		seen[a] = true
	}
}

func TestPKIIssuesOnceAndNilIsPlaintext(t *testing.T) {
	p, err := NewPKI(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Issue("node", "n1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.Issue("node", "n1")
	if err != nil || again != c {
		t.Fatalf("second issue: %+v, %v; want the first files %+v", again, err, c)
	}
	src, err := p.Source("node", "n1")
	if err != nil {
		t.Fatal(err)
	}
	if id := src.Identity(); id.Kind != "node" || id.Name != "n1" {
		t.Errorf("identity %+v, want node/n1", id)
	}
	args, err := p.Args("admin", "demo")
	if err != nil || len(args) != 6 || args[0] != "--tls-cert" || !strings.HasSuffix(args[1], "admin-demo.crt") {
		t.Errorf("args %q, %v", args, err)
	}
	if _, err := p.Issue("node", "bad/name"); err == nil {
		t.Error("a bad name was issued")
	}

	var none *PKI
	if args, err := none.Args("node", "n1"); err != nil || args != nil {
		t.Errorf("nil PKI args %q, %v; want none", args, err)
	}
	if src, err := none.Source("node", "n1"); err != nil || src != nil {
		t.Errorf("nil PKI source %v, %v; want plaintext", src, err)
	}
}

// The web line names the https URL and a PKCS#12 file of the admin that decodes, with the
// empty password it promises, into that admin's certificate; without a PKI, the http URL.
func TestWebLineNamesTheURLAndAnAdminsPKCS12(t *testing.T) {
	dir := t.TempDir()
	p, err := NewPKI(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	line, err := p.WebLine("127.0.0.1:7071", "demo")
	if err != nil {
		t.Fatal(err)
	}
	p12 := filepath.Join(dir, "admin-demo.p12")
	want := "web:         https://127.0.0.1:7071/ui/  (import " + p12 + " into the browser, empty password; see docs/SECURITY.md)"
	if line != want {
		t.Errorf("line\n%q, want\n%q", line, want)
	}
	data, err := os.ReadFile(p12)
	if err != nil {
		t.Fatal(err)
	}
	_, cert, chain, err := pkcs12.DecodeChain(data, "")
	if err != nil {
		t.Fatalf("%s: %v", p12, err)
	}
	files, err := p.Issue("admin", "demo")
	if err != nil {
		t.Fatal(err)
	}
	src, err := files.Load()
	if err != nil {
		t.Fatal(err)
	}
	if id, err := mtls.IdentityOf(cert); err != nil || id != src.Identity() || len(chain) != 1 {
		t.Errorf("the .p12 holds %v (%v) and %d CA certificates; want %v and the CA", id, err, len(chain), src.Identity())
	}

	var none *PKI
	if line, err := none.WebLine("127.0.0.1:7071", "demo"); err != nil || line != "web:         http://127.0.0.1:7071/ui/" {
		t.Errorf("nil PKI: %q, %v", line, err)
	}
	if path, err := none.PKCS12("admin", "demo"); err != nil || path != "" {
		t.Errorf("nil PKI wrote %q, %v", path, err)
	}
}

func TestCPUSecondsReadsAProcessesTime(t *testing.T) {
	before, err := CPUSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := CPUSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("200 ms of spinning: CPU time went from %.2f s to %.2f s", before, after)
	}
	if _, err := CPUSeconds(-1); err == nil || !strings.Contains(err.Error(), "launch: the CPU time of process -1") {
		t.Errorf("a process that does not exist: %v", err)
	}
}
