package sim

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Report is the outcome of simulating one or more algorithms on the same work.
type Report struct {
	Runs []Result `json:"runs"`
}

// Formats lists the output formats Write accepts.
var Formats = []string{"table", "json", "csv"}

// Write writes the report in format: table, json or csv.
func (r Report) Write(w io.Writer, format string) error {
	switch format {
	case "table":
		return r.writeTable(w)
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case "csv":
		return r.writeCSV(w)
	}
	return fmt.Errorf("sim: unknown format %q (want %s)", format, strings.Join(Formats, ", "))
}

// writeTable prints the epochs side by side, one group of columns per run, then a summary
// line per run.
func (r Report) writeTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"epoch", "nodes"}
	for _, run := range r.Runs {
		head = append(head, run.Label()+" imbalance", "reported", "forecast err", "churn", "slices", "orphaned", "orphaned load", "key copies")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	if len(r.Runs) > 0 {
		for i, e := range r.Runs[0].Epochs {
			row := []string{strconv.Itoa(e.Epoch), strconv.Itoa(e.Nodes)}
			for _, run := range r.Runs {
				e := run.Epochs[i]
				row = append(row, fmt.Sprintf("%.3f", e.Imbalance), fmt.Sprintf("%.3f", e.ReportedImbalance),
					fmt.Sprintf("%.1f%%", 100*e.ForecastError), fmt.Sprintf("%.2f%%", 100*e.Churn), strconv.Itoa(e.Slices),
					fmt.Sprintf("%.2f%%", 100*e.Orphaned), fmt.Sprintf("%.2f%%", 100*e.OrphanedLoad), fmt.Sprintf("%.3f", e.KeyCopies))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "algorithm\tengine\tfinal imbalance\tmean imbalance\tmax imbalance\tmean reported\t"+
		"mean forecast err\tthrashing\tmax churn\ttotal churn\tmax orphaned\tmax orphaned load\tundone moves\tping-pongs\t"+
		"split/merge cycles\tmean key copies\tmax key copies\t")
	for _, run := range r.Runs {
		s := run.Summary
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.1f%%\t%.3f\t%.2f%%\t%.2f%%\t%.2f%%\t%.2f%%\t%d (<%d)\t%d\t%d\t%.3f\t%.3f\t\n",
			run.Algorithm, run.Engine, s.FinalImbalance, s.MeanImbalance, s.MaxImbalance, s.MeanReportedImbalance,
			100*s.MeanForecastError, s.Thrashing, 100*s.MaxChurn, 100*s.TotalChurn, 100*s.MaxOrphaned,
			100*s.MaxOrphanedLoad, s.UndoneMoves, s.HoldPasses, s.PingPongs, s.SplitMergeCycles, s.MeanKeyCopies, s.MaxKeyCopies)
	}
	return tw.Flush()
}

func (r Report) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"algorithm", "engine", "epoch", "imbalance", "reported_imbalance", "forecast_error", "churn", "slices", "nodes", "orphaned", "orphaned_load",
		"undone_moves", "ping_pongs", "split_merge_cycles", "key_copies"})
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	for _, run := range r.Runs {
		for _, e := range run.Epochs {
			cw.Write([]string{run.Algorithm, string(run.Engine), strconv.Itoa(e.Epoch), f(e.Imbalance),
				f(e.ReportedImbalance), f(e.ForecastError), f(e.Churn), strconv.Itoa(e.Slices), strconv.Itoa(e.Nodes), f(e.Orphaned), f(e.OrphanedLoad),
				strconv.Itoa(e.UndoneMoves), strconv.Itoa(e.PingPongs), strconv.Itoa(e.SplitMergeCycles), f(e.KeyCopies)})
		}
	}
	cw.Flush()
	return cw.Error()
}
