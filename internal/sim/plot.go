package sim

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// PlotFormat returns the image format a plot file name asks for, svg or png.
func PlotFormat(name string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(name)); ext {
	case ".svg", ".png":
		return ext[1:], nil
	}
	return "", fmt.Errorf("sim: plot file %q: want a name ending in .svg or .png", name)
}

// Plot draws imbalance, churn and forecast error per epoch, one line per run, as an SVG or
// PNG image (format as PlotFormat returns it). title describes the work, for the figure's
// heading.
func (r Report) Plot(w io.Writer, format, title string) error {
	imb, churn, fc := plot.New(), plot.New(), plot.New()
	imb.Title.Text = "Imbalance (max / mean node load) — " + title
	imb.X.Label.Text, imb.Y.Label.Text = "epoch", "imbalance (log scale)"
	imb.Y.Scale, imb.Y.Tick.Marker = plot.LogScale{}, imbalanceTicks{}
	churn.Title.Text = "Churn (share of keys copied to new nodes per pass)"
	churn.X.Label.Text, churn.Y.Label.Text = "epoch", "churn (% of keys)"
	fc.Title.Text = "Forecast error (load-weighted mean absolute % error of the per-node load forecast)"
	fc.X.Label.Text, fc.Y.Label.Text = "epoch", "forecast error (%)"
	churn.Y.Min, fc.Y.Min, fc.X.Min = 0, 0, 0
	for _, p := range []*plot.Plot{imb, churn, fc} {
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
	}
	var topImb, topChurn, topFc float64
	for i, run := range r.Runs {
		topImb, topChurn = max(topImb, run.Summary.MaxImbalance), max(topChurn, 100*run.Summary.MaxChurn)
		imbXY, churnXY := make(plotter.XYs, len(run.Epochs)), make(plotter.XYs, len(run.Epochs))
		fcXY := make(plotter.XYs, 0, len(run.Epochs))
		for k, e := range run.Epochs {
			imbXY[k] = plotter.XY{X: float64(e.Epoch), Y: max(e.Imbalance, 1)}
			churnXY[k] = plotter.XY{X: float64(e.Epoch), Y: 100 * e.Churn}
			if k > 0 { // at epoch 0 nothing was measured: the error is 100% by definition
				fcXY = append(fcXY, plotter.XY{X: float64(e.Epoch), Y: 100 * e.ForecastError})
				topFc = max(topFc, 100*e.ForecastError)
			}
		}
		for _, s := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{imb, imbXY}, {churn, churnXY}, {fc, fcXY}} {
			if err := addLine(s.p, s.xys, run.Label(), i); err != nil {
				return fmt.Errorf("sim: plotting %s: %w", run.Label(), err)
			}
		}
	}
	// Headroom above the data keeps the legend, drawn at the top, off the lines.
	legendRows := 1 + 0.12*float64(len(r.Runs))
	imb.Y.Min, imb.Y.Max = 1, math.Pow(max(topImb, 1.1), legendRows)
	churn.Y.Max = max(topChurn, 1) * legendRows
	fc.Y.Max = max(topFc, 1) * legendRows
	return drawStacked(w, format, [][]*plot.Plot{{imb}, {churn}, {fc}})
}

// addLine adds a run's line, in the run's colour, dashes and marks, to p and its legend.
func addLine(p *plot.Plot, xys plotter.XYs, label string, i int) error {
	if len(xys) == 0 {
		return nil
	}
	line, points, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	line.Color, line.Dashes = plotutil.Color(i), plotutil.Dashes(i)
	points.Color, points.Shape = plotutil.Color(i), plotutil.Shape(i)
	p.Add(line, points)
	p.Legend.Add(label, line, points)
	return nil
}

// drawStacked draws plots, one above the other, as an SVG or PNG image.
func drawStacked(w io.Writer, format string, plots [][]*plot.Plot) error {
	width, height := 24*vg.Centimeter, 30*vg.Centimeter
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Centimeter, PadY: vg.Centimeter,
		PadTop: vg.Centimeter / 2, PadBottom: vg.Centimeter / 2, PadLeft: vg.Centimeter / 2, PadRight: vg.Centimeter / 2}
	var c vg.CanvasSizer
	var out io.WriterTo
	switch format {
	case "svg":
		svg := vgsvg.New(width, height)
		c, out = svg, svg
	case "png":
		img := vgimg.New(width, height)
		c, out = img, vgimg.PngCanvas{Canvas: img}
	default:
		return fmt.Errorf("sim: unknown plot format %q (want svg or png)", format)
	}
	canvases := plot.Align(plots, tiles, draw.New(c))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	_, err := out.WriteTo(w)
	return err
}

// imbalanceTicks labels a log axis of imbalances at readable values, 1, 1.1, 1.2, 1.5, 2, 3, 5,
// 7, 10, 20, ..., where plot.LogTicks would label only powers of ten.
type imbalanceTicks struct{}

func (imbalanceTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for decade := 1.0; decade <= hi*10; decade *= 10 {
		for _, m := range []float64{1, 1.1, 1.2, 1.5, 2, 3, 5, 7} {
			v := m * decade
			if v < lo*0.999 || v > hi*1.001 || (decade > 1 && m < 2 && m != 1) {
				continue
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', 3, 64)})
		}
	}
	if len(ticks) < 2 { // a narrow range: label its ends
		ticks = []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'f', 3, 64)}, {Value: hi, Label: strconv.FormatFloat(hi, 'f', 3, 64)}}
	}
	return ticks
}
