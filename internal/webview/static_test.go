package webview_test

import (
	"io"
	"mime"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// csp is the page's Content-Security-Policy: scripts only from the assigner itself (the
// modules are files, none inline), styles inline too (the page sets element styles).
const csp = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'"

var (
	scriptTag = regexp.MustCompile(`(?is)<script\b([^>]*)>(.*?)</script>`)
	// A module's imports: the names it takes, if any, and where from.
	importStmt = regexp.MustCompile(`(?m)^import\s+(?:\{([^}]*)\}\s+from\s+)?'([^']*)';`)
	// Any import, or re-export, of whatever form: each must be one importStmt reads.
	anyImport = regexp.MustCompile(`(?m)^(?:import\b[^;]*?|export\s*(?:\*|\{[^}]*\})\s*from\s*)['"]([^'"]*)['"]`)
	// The names a module exports: a function's, or each of a const's declarators.
	exportFunc  = regexp.MustCompile(`(?m)^export\s+(?:async\s+)?function\s+([\w$]+)`)
	exportConst = regexp.MustCompile(`(?m)^export\s+const\s+(.*)$`)
	declarator  = regexp.MustCompile(`(?:^|,\s*)([\w$]+)\s*=`)
)

// getText fetches a page or an asset of the view.
func getText(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

// TestThePageLoadsItsModules checks, without a browser, what a browser needs of the page's
// scripts: one module script, the entry, and no inline script, which the CSP would refuse;
// every module it imports, directly or not, embedded and served as JavaScript (a module of
// another type is refused under nosniff) with the same headers as the page; every import a
// relative path, since nothing resolves a bare name without a build step; every imported
// name exported by its module; and no embedded module left unreached.
func TestThePageLoadsItsModules(t *testing.T) {
	_, base := serve(t, newFleet(3))
	resp, page := getText(t, base)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, csp, resp.Header.Get("Content-Security-Policy"))
	assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	tags := scriptTag.FindAllStringSubmatch(page, -1)
	require.Len(t, tags, 1, "the page's script tags")
	assert.Regexp(t, `\btype="module"`, tags[0][1])
	assert.Regexp(t, `\bsrc="app\.js"`, tags[0][1])
	assert.Empty(t, strings.TrimSpace(tags[0][2]), "an inline script")

	exports := map[string][]string{}
	imports := map[string]map[string][]string{} // module -> module imported -> names
	queue := []string{"app.js"}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if _, done := exports[name]; done {
			continue
		}
		resp, src := getText(t, base+name)
		require.Equal(t, http.StatusOK, resp.StatusCode, name)
		mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		require.NoError(t, err, name)
		assert.Contains(t, []string{"text/javascript", "application/javascript"}, mt, "%s's Content-Type", name)
		assert.Equal(t, csp, resp.Header.Get("Content-Security-Policy"), name)
		assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), name)

		all := anyImport.FindAllStringSubmatch(src, -1)
		for _, m := range all {
			assert.Regexp(t, `^\./[\w-]+\.js$`, m[1], "%s imports %q", name, m[1])
		}
		require.Len(t, importStmt.FindAllStringSubmatch(src, -1), len(all),
			"%s has an import this test does not read: write it as import { names } from './module.js';", name)
		exports[name] = nil
		for _, m := range exportFunc.FindAllStringSubmatch(src, -1) {
			exports[name] = append(exports[name], m[1])
		}
		for _, m := range exportConst.FindAllStringSubmatch(src, -1) {
			for _, d := range declarator.FindAllStringSubmatch(m[1], -1) {
				exports[name] = append(exports[name], d[1])
			}
		}
		imports[name] = map[string][]string{}
		for _, m := range importStmt.FindAllStringSubmatch(src, -1) {
			from := strings.TrimPrefix(m[2], "./")
			for n := range strings.SplitSeq(m[1], ",") {
				if n, _, _ = strings.Cut(strings.TrimSpace(n), " as "); n != "" {
					imports[name][from] = append(imports[name][from], n)
				}
			}
			queue = append(queue, from)
		}
	}
	for name, froms := range imports {
		for from, names := range froms {
			for _, n := range names {
				assert.Contains(t, exports[from], n, "%s imports %s from %s, which does not export it", name, n, from)
			}
		}
	}

	embedded, err := filepath.Glob(filepath.Join("static", "*.js"))
	require.NoError(t, err)
	require.NotEmpty(t, embedded)
	for _, f := range embedded {
		_, reached := exports[filepath.Base(f)]
		assert.True(t, reached, "%s is embedded but no module imports it", f)
	}
	loaded := make([]string, 0, len(exports))
	for name := range exports {
		loaded = append(loaded, name)
	}
	slices.Sort(loaded)
	t.Logf("modules: %s", strings.Join(loaded, ", "))
}
