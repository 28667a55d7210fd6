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
	epochs := []Epoch{{Epoch: 0, Imbalance: 1.8, Churn: 0, Slices: 1234, Nodes: 20}, {Epoch: 1, Imbalance: 1.04, Churn: 0.08, Slices: 1240, Nodes: 20}}
	return Report{Runs: []Result{
		{Algorithm: "weighted-move", Epochs: epochs, Summary: summarize(epochs)},
		{Algorithm: "range", Epochs: []Epoch{{Epoch: 0, Imbalance: 3, Slices: 20, Nodes: 20}, {Epoch: 1, Imbalance: 3, Slices: 20, Nodes: 20}},
			Summary: Summary{FinalImbalance: 3, MeanImbalance: 3, MaxImbalance: 3}},
	}}
}

func TestJSONHasTheDocumentedShape(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sampleReport().Write(&b, "json"))
	var doc struct {
		Runs []struct {
			Algorithm string           `json:"algorithm"`
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
	assert.Equal(t, map[string]any{"epoch": 0.0, "imbalance": 1.8, "churn": 0.0, "slices": 1234.0, "nodes": 20.0}, wm.Epochs[0])
	assert.Equal(t, map[string]any{
		"final_imbalance": 1.04, "mean_imbalance": 1.42, "max_imbalance": 1.8, "max_churn": 0.08, "total_churn": 0.08,
	}, wm.Summary)
}

func TestCSVAndTable(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sampleReport().Write(&b, "csv"))
	rows, err := csv.NewReader(&b).ReadAll()
	require.NoError(t, err)
	assert.Equal(t, []string{"algorithm", "epoch", "imbalance", "churn", "slices", "nodes"}, rows[0])
	assert.Equal(t, []string{"weighted-move", "1", "1.04", "0.08", "1240", "20"}, rows[2])
	assert.Len(t, rows, 5)

	b.Reset()
	require.NoError(t, sampleReport().Write(&b, "table"))
	out := b.String()
	assert.Contains(t, out, "weighted-move imbalance")
	assert.Regexp(t, `(?m)^\s+1\s+20\s+1\.040\s+8\.00%\s+1240\s+3\.000\s+0\.00%\s+20\s*$`, out)
	assert.Regexp(t, `(?m)^\s+weighted-move\s+1\.040\s+1\.420\s+1\.800\s+8\.00%\s+8\.00%\s*$`, out)

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
