package sim

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"image/png"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleReport() Report {
	epochs := []Epoch{{Epoch: 0, Imbalance: 1.8, ReportedImbalance: 1, ForecastError: 1, Churn: 0, Slices: 1234, Nodes: 20,
		KeyCopies: 1},
		{Epoch: 1, Imbalance: 1.04, ReportedImbalance: 1.02, ForecastError: 0.25, Churn: 0.08, Slices: 1240, Nodes: 20,
			UndoneMoves: 3, PingPongs: 1, SplitMergeCycles: 2, KeyCopies: 1.25}}
	wm := Result{Algorithm: "weighted-move", Engine: EngineCore, Epochs: epochs, Summary: summarize(epochs)}
	wm.Summary.Thrashing = 0.125
	wm.Summary.HoldPasses = 4
	return Report{Runs: []Result{
		wm,
		{Algorithm: "range", Engine: EngineAlgorithm, Epochs: []Epoch{{Epoch: 0, Imbalance: 3, Slices: 20, Nodes: 20}, {Epoch: 1, Imbalance: 3, Slices: 20, Nodes: 20}},
			Summary: Summary{FinalImbalance: 3, MeanImbalance: 3, MaxImbalance: 3}},
	}}
}

func TestJSONHasTheDocumentedShape(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sampleReport().Write(&b, "json"))
	var doc struct {
		Runs []struct {
			Algorithm string           `json:"algorithm"`
			Engine    string           `json:"engine"`
			Epochs    []map[string]any `json:"epochs"`
			Summary   map[string]any   `json:"summary"`
		} `json:"runs"`
	}
	dec := json.NewDecoder(&b)
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&doc))
	require.Len(t, doc.Runs, 2)
	wm := doc.Runs[0]
	assert.Equal(t, "weighted-move", wm.Algorithm)
	assert.Equal(t, "core", wm.Engine)
	assert.Equal(t, "algorithm", doc.Runs[1].Engine)
	assert.Equal(t, map[string]any{"epoch": 0.0, "imbalance": 1.8, "reported_imbalance": 1.0, "forecast_error": 1.0,
		"churn": 0.0, "slices": 1234.0, "nodes": 20.0, "orphaned": 0.0, "orphaned_load": 0.0,
		"undone_moves": 0.0, "ping_pongs": 0.0, "split_merge_cycles": 0.0, "key_copies": 1.0}, wm.Epochs[0])
	assert.Equal(t, map[string]any{
		"final_imbalance": 1.04, "mean_imbalance": 1.42, "max_imbalance": 1.8, "mean_reported_imbalance": 1.01,
		"mean_forecast_error": 0.25, "thrashing": 0.125, "max_churn": 0.08, "total_churn": 0.08,
		"max_orphaned": 0.0, "max_orphaned_load": 0.0, "undone_moves": 3.0, "ping_pongs": 1.0, "hold_passes": 4.0,
		"split_merge_cycles": 2.0, "mean_key_copies": 1.125, "max_key_copies": 1.25,
	}, wm.Summary)
}

func TestCSVAndTable(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sampleReport().Write(&b, "csv"))
	rows, err := csv.NewReader(&b).ReadAll()
	require.NoError(t, err)
	assert.Equal(t, []string{"algorithm", "engine", "epoch", "imbalance", "reported_imbalance", "forecast_error", "churn", "slices", "nodes", "orphaned", "orphaned_load", "undone_moves", "ping_pongs",
		"split_merge_cycles", "key_copies"}, rows[0])
	assert.Equal(t, []string{"weighted-move", "core", "1", "1.04", "1.02", "0.25", "0.08", "1240", "20", "0", "0", "3", "1", "2", "1.25"}, rows[2])
	assert.Len(t, rows, 5)

	b.Reset()
	require.NoError(t, sampleReport().Write(&b, "table"))
	out := b.String()
	assert.Contains(t, out, "weighted-move imbalance")
	assert.Contains(t, out, "range (algorithm) imbalance")
	assert.Contains(t, out, "key copies")
	assert.Regexp(t, `(?m)^\s+1\s+20\s+1\.040\s+1\.020\s+25\.0%\s+8\.00%\s+1240\s+0\.00%\s+0\.00%\s+1\.250\s+3\.000\s+0\.000\s+0\.0%\s+0\.00%\s+20\s+0\.00%\s+0\.00%\s+0\.000\s*$`, out)
	assert.Regexp(t, `(?m)^\s+weighted-move\s+core\s+1\.040\s+1\.420\s+1\.800\s+1\.010\s+25\.0%\s+0\.125\s+8\.00%\s+8\.00%\s+0\.00%\s+0\.00%\s+3 \(<4\)\s+1\s+2\s+1\.125\s+1\.250\s*$`, out)

	assert.Error(t, sampleReport().Write(&b, "xml"))
}

func TestPlotDrawsSVGAndPNG(t *testing.T) {
	var svg bytes.Buffer
	require.NoError(t, sampleReport().Plot(&svg, "svg", "zipf:1.1, 1000 keys"))
	var root struct {
		XMLName xml.Name
		Width   string `xml:"width,attr"`
	}
	require.NoError(t, xml.NewDecoder(bytes.NewReader(svg.Bytes())).Decode(&root))
	assert.Equal(t, "svg", root.XMLName.Local)
	for _, text := range []string{"weighted-move", "range", "Imbalance", "Churn", "zipf:1.1, 1000 keys"} {
		assert.True(t, strings.Contains(svg.String(), text), "the plot shows %q", text)
	}

	var img bytes.Buffer
	require.NoError(t, sampleReport().Plot(&img, "png", "t"))
	decoded, err := png.Decode(&img)
	require.NoError(t, err)
	assert.Greater(t, decoded.Bounds().Dx(), 500)

	assert.Error(t, sampleReport().Plot(&img, "gif", "t"))
	for name, want := range map[string]string{"a.svg": "svg", "B.PNG": "png"} {
		got, err := PlotFormat(name)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	_, err = PlotFormat("out.pdf")
	assert.Error(t, err)
}
