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

// writeTable prints the epochs side by side, one pair of columns per algorithm, then a
// summary line per algorithm.
func (r Report) writeTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"epoch", "nodes"}
	for _, run := range r.Runs {
		head = append(head, run.Algorithm+" imbalance", "churn", "slices")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	if len(r.Runs) > 0 {
		for i, e := range r.Runs[0].Epochs {
			row := []string{strconv.Itoa(e.Epoch), strconv.Itoa(e.Nodes)}
			for _, run := range r.Runs {
				e := run.Epochs[i]
				row = append(row, fmt.Sprintf("%.3f", e.Imbalance), fmt.Sprintf("%.2f%%", 100*e.Churn), strconv.Itoa(e.Slices))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "algorithm\tfinal imbalance\tmean imbalance\tmax imbalance\tmax churn\ttotal churn\t")
	for _, run := range r.Runs {
		s := run.Summary
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%.2f%%\t%.2f%%\t\n", run.Algorithm,
			s.FinalImbalance, s.MeanImbalance, s.MaxImbalance, 100*s.MaxChurn, 100*s.TotalChurn)
	}
	return tw.Flush()
}

func (r Report) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"algorithm", "epoch", "imbalance", "churn", "slices", "nodes"})
	for _, run := range r.Runs {
		for _, e := range run.Epochs {
			cw.Write([]string{run.Algorithm, strconv.Itoa(e.Epoch),
				strconv.FormatFloat(e.Imbalance, 'g', -1, 64), strconv.FormatFloat(e.Churn, 'g', -1, 64),
				strconv.Itoa(e.Slices), strconv.Itoa(e.Nodes)})
		}
	}
	cw.Flush()
	return cw.Error()
}
