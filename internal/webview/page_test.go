package webview_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/slicectl"
	"github.com/sliceplane/sliceplane/internal/webview"
)

// TestThePageInABrowser opens the web view of a running assigner in headless Chromium: the
// page loads without a console error, the heatmap draws the map's slices, a `slicectl move`
// shows in the feed and on the heatmap within 2 s, and a browser without a certificate gets
// no page.
func TestThePageInABrowser(t *testing.T) {
	b := newBrowser(t)
	c := startCluster(t, 4)
	viewer := c.pki.Source("viewer", "vera").ClientTLS("assigner")
	base := proxy(t, "https://"+c.srv.MetricsAddr(), viewer)
	require.NoError(t, b.do(t, 30*time.Second, chromedp.Navigate(base+webview.Path)))
	b.waitFor(t, 30*time.Second, "the heatmap draws the map of the four nodes",
		`window.sliceplane && sliceplane.frames > 0 && sliceplane.lastGrid && sliceplane.lastGrid.nodes.length == 4 &&
		 Number(document.getElementById("heatmap").dataset.nonzero) > 0`)
	// The newest column of the grid covers the space: every row has a holder.
	holders := eval[[]int](t, b, `(() => { const g = sliceplane.lastGrid; return Array.from(g.holder.slice((g.w-1)*g.h, g.w*g.h)) })()`)
	for r, h := range holders {
		require.GreaterOrEqual(t, h, 0, "row %d of the newest column has no holder", r)
	}

	ctx := context.Background()
	slice, to := c.sliceToMove(t)
	admin := c.pki.Config("admin", "alice")
	var out strings.Builder
	asked := time.Now()
	require.NoError(t, slicectl.Execute(ctx, []string{"--assigner", c.srv.Addr(), "--tls-cert", admin.Cert, "--tls-key", admin.Key,
		"--tls-ca", admin.CA, "move", slice, "--to", to}, &out, &out), out.String())
	within := 2 * time.Second
	if raceDetector {
		within = 8 * time.Second
	}
	b.waitFor(t, within, "the move in the feed",
		`[...document.querySelectorAll("li[data-cause]")].some(li => li.dataset.cause.startsWith("admin: move"))`)
	b.waitFor(t, within-time.Since(asked)+100*time.Millisecond, "the move on the heatmap",
		`sliceplane.lastGrid.events.some(e => e.kind == "move" && e.cause.startsWith("admin: move"))`)
	t.Logf("the move was in the feed and on the heatmap %s after slicectl was started", time.Since(asked))
	assert.Less(t, time.Since(asked), within+100*time.Millisecond)
	// The other colourings draw too: by holder, and by role of one node.
	for _, mode := range []struct{ mode, node string }{{"node", ""}, {"role", "n1"}, {"load", ""}} {
		frames := eval[int](t, b, `sliceplane.frames`)
		eval[bool](t, b, `(() => { const s = document.getElementById("mode"); s.value = "`+mode.mode+`"; s.dispatchEvent(new Event("change"));
			const n = document.getElementById("node-select"); n.value = "`+mode.node+`"; n.dispatchEvent(new Event("change")); return true })()`)
		cond := `sliceplane.frames > ` + strconv.Itoa(frames)
		if mode.node != "" { // the node's ranges show: it holds some
			cond += ` && sliceplane.lastGrid.role.some(r => r == 2)`
		}
		b.waitFor(t, within, "a frame coloured by "+mode.mode, cond)
	}
	assert.Empty(t, b.consoleErrors(), "the page logged errors")
	b.screenshot(t)

	// Straight to the assigner, without a certificate: the handshake fails, no page.
	err := b.do(t, 20*time.Second, chromedp.Navigate("https://"+c.srv.MetricsAddr()+webview.Path))
	if err == nil {
		has := eval[bool](t, b, `document.getElementById("heatmap") !== null`)
		assert.False(t, has, "a browser without a certificate got the page")
	}
}
