package webview_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/heatmap"
	"github.com/sliceplane/sliceplane/internal/webview"
)

// standby is a Backend that does not lead.
type standby struct{ fleet }

func (standby) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{Leader: false, LeaderAddress: "10.0.0.1:7070"}, nil
}

func serve(t *testing.T, b webview.Backend) (*webview.View, string) {
	v, err := webview.New(heatmap.Config{Columns: 10, Cells: 8}, b, "zone")
	require.NoError(t, err)
	srv := httptest.NewServer(v.Handler(slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	return v, srv.URL + webview.Path
}

func get(t *testing.T, url string) (int, map[string]any) {
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	}
	return resp.StatusCode, out
}

// TestBadQueriesGetAClearError: every malformed parameter is a 400 that names it.
func TestBadQueriesGetAClearError(t *testing.T) {
	v, base := serve(t, newFleet(3))
	v.Record(time.Unix(1, 0), bigMap(t, 16, 3), nil)
	for query, want := range map[string]string{
		"api/heatmap?w=0":     "a grid of 0×256",
		"api/heatmap?w=99999": "a grid of 2001×256",
		"api/heatmap?h=x":     `h "x"`,
		"api/heatmap?lo=zz":   `lo "zz"`,
		"api/heatmap?lo=8000000000000000&hi=4000000000000000": "is empty",
		"api/heatmap?from=5&to=2":                             "columns 5..2",
		"api/heatmap?node=" + strings.Repeat("n", 300):        "node: 300 bytes",
		"api/cell?seq=1&at=nothex":                            `at "nothex"`,
		"api/cell?seq=x&at=00":                                `seq "x"`,
	} {
		code, body := get(t, base+query)
		assert.Equal(t, http.StatusBadRequest, code, query)
		assert.Contains(t, body["error"], want, query)
		assert.True(t, strings.HasPrefix(body["error"].(string), "webview: "), query)
	}
	code, body := get(t, base+"api/cell?seq=1&at=0000000000000000")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, float64(2), body["slices"], "16 slices in 8 cells")
	code, body = get(t, base+"api/heatmap?w=2&h=4")
	require.Equal(t, http.StatusOK, code)
	for _, layer := range []string{"load", "holder", "role"} {
		assert.Len(t, body[layer], 8, "the %s layer is an array of a number a cell", layer)
	}
	// The binary form carries the same grid.
	resp, err := http.Get(base + "api/heatmap?w=2&h=4&format=bin")
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	n := int(binary.LittleEndian.Uint32(raw))
	var meta map[string]any
	require.NoError(t, json.Unmarshal(raw[4:4+n], &meta))
	assert.Equal(t, body["seqs"], meta["seqs"])
	off := (4 + n + 3) &^ 3
	require.Len(t, raw, off+8*4+8*4+8)
	for i := range 8 {
		assert.InDelta(t, body["load"].([]any)[i], math.Float32frombits(binary.LittleEndian.Uint32(raw[off+4*i:])), 1e-3*body["maxLoad"].(float64))
		assert.Equal(t, body["holder"].([]any)[i], float64(int32(binary.LittleEndian.Uint32(raw[off+32+4*i:]))))
		assert.Equal(t, body["role"].([]any)[i], float64(raw[off+64+i]))
	}
}

// TestAStandbyShowsWhereTheLeaderIs: its state says so, and it draws no history.
func TestAStandbyShowsWhereTheLeaderIs(t *testing.T) {
	_, base := serve(t, standby{newFleet(3)})
	code, body := get(t, base+"api/state")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, false, body["leader"])
	assert.Equal(t, "10.0.0.1:7070", body["leaderAddress"])
	code, body = get(t, base+"api/heatmap")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body["error"], "not the leader; the leader is at 10.0.0.1:7070")
}

// TestTheStreamSaysWhenSomethingChanged: one update when it opens, one after a change, and
// a burst of changes makes one.
func TestTheStreamSaysWhenSomethingChanged(t *testing.T) {
	v, base := serve(t, newFleet(3))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"api/events", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	next := func() string {
		for lines.Scan() {
			if data, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
				return data
			}
		}
		t.Fatalf("the stream ended: %v", lines.Err())
		return ""
	}
	assert.Equal(t, `{"version":0,"last":0}`, next())
	a := bigMap(t, 16, 3)
	for i := range 5 {
		v.Record(time.Unix(int64(i), 0), a, nil)
	}
	updates := 1
	for next() != `{"version":5,"last":5}` {
		updates++
	}
	// Five changes within microseconds make one update, two if the machine paused the stream
	// between them for its 250 ms.
	assert.LessOrEqual(t, updates, 2, "updates for a burst of five changes")
}
