package webview_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// browser is a headless Chromium's tab, with what the page logged as an error or a warning,
// or threw.
type browser struct {
	ctx    context.Context
	mu     sync.Mutex
	errors []string
}

// newBrowser starts a headless Chromium, or skips the test when none is installed.
func newBrowser(t testing.TB) *browser {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("no Chromium on this machine (Debian's chromium package): the browser tests need one")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path),
		chromedp.NoSandbox, // Chromium refuses to run as root with its sandbox
		// The test's CA is no browser's: trusting any server certificate leaves the client's
		// certificate, the thing under test, the only reason a handshake fails.
		chromedp.IgnoreCertErrors,
		chromedp.DisableGPU, chromedp.WindowSize(1400, 1000), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		cancel()
		cancelAlloc()
		t.Fatalf("starting %s: %v", path, err)
	}
	b := &browser{ctx: ctx}
	var wg sync.WaitGroup
	wg.Go(func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			switch m.Type {
			case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
				b.add(fmt.Sprintf("%s: %s", m.Type, m.Text))
			}
		}
	})
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		wg.Wait()
	})
	return b
}

func (b *browser) add(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errors = append(b.errors, s)
}

// consoleErrors returns what the page logged as errors so far.
func (b *browser) consoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...)
}

// do runs actions within d.
func (b *browser) do(t testing.TB, d time.Duration, actions ...chromedp.Action[chromedp.Void]) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}

// eval evaluates a JavaScript expression, awaiting a promise, into a T.
func eval[T any](t testing.TB, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	require.NoError(t, err, "evaluating %s", expr)
	return v
}

// waitFor polls a JavaScript condition until it holds or d passes.
func (b *browser) waitFor(t testing.TB, d time.Duration, what, cond string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("Boolean("+cond+")"))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (%s; last error %v; console %v)", what, d, cond, err, b.consoleErrors())
		}
		time.Sleep(50 * time.Millisecond) // the page tells us nothing: look again soon
	}
}

// proxy serves target's pages on a loopback port of the test's own, authenticating to target
// with conf: the browser reaches a page behind mutual TLS without a certificate store of its
// own, and the assigner's listener stays closed to anyone without a certificate.
func proxy(t testing.TB, target string, conf *tls.Config) string {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{TLSClientConfig: conf}
	rp.FlushInterval = -1 // server-sent events go through at once
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis) //nolint:errcheck // ends with Close
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return "http://" + lis.Addr().String()
}

// screenshot writes the page's screenshot to the path in SLICEPLANE_SCREENSHOT, if set: the
// README's picture is made this way.
func (b *browser) screenshot(t testing.TB) {
	path := os.Getenv("SLICEPLANE_SCREENSHOT")
	if path == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("wrote %s", path)
}
