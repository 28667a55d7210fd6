package heatmap_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/heatmap"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// TestScripts runs the scripts of testdata/scripts/: a History is made with `new`, fed maps with
// `record` (one slice a line: its start, its replicas, * after the primary, ~ after a loading
// replica, and its load), and read with `grid`, `cell`, `bounds` and `events`.
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/scripts", func(t *testing.T, path string) {
		var h *heatmap.History
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "new":
				var err error
				h, err = heatmap.New(heatmap.Config{Columns: intArg(t, d, "columns", 0), Cells: intArg(t, d, "cells", 0), Events: intArg(t, d, "events", 0)})
				if err != nil {
					return err.Error()
				}
				return ""
			case "record":
				a, loads := parseMap(t, d.Input)
				return fmt.Sprintf("seq %d", h.Record(time.UnixMilli(int64(intArg(t, d, "at", 0))*1000), a, loads))
			case "grid":
				return grid(t, h, d)
			case "cell":
				c, err := h.CellAt(uint64(intArg(t, d, "seq", 0)), point(t, stringArg(t, d, "at", "0")))
				if err != nil {
					return err.Error()
				}
				return fmt.Sprintf("seq %d at %d: %s slices=%d load=%g replicas=%v more=%d", c.Seq, c.At.Unix(), c.Range, c.Slices, c.Load, c.Replicas, c.More)
			case "bounds":
				b := h.Bounds()
				return fmt.Sprintf("%d..%d (%d columns) %d..%d", b.First, b.Last, b.Columns, b.FirstTime.Unix(), b.LastTime.Unix())
			case "drain":
				h.Add(heatmap.Event{Kind: heatmap.KindDrain, Range: keyspace.Full(), Cause: "admin:drain", What: stringArg(t, d, "node", "")})
				return ""
			case "events":
				var out strings.Builder
				for _, e := range h.Events(uint64(intArg(t, d, "from", 0)), uint64(intArg(t, d, "to", 1<<30)), keyspace.Full(), intArg(t, d, "limit", 100)) {
					fmt.Fprintf(&out, "after %d: %s %s %s %s\n", e.Seq, e.Kind, e.Range, e.Cause, e.What)
				}
				return out.String()
			}
			t.Fatalf("unknown command %s", d.Cmd)
			return ""
		})
	})
}

// grid prints a grid a column a line, each row as load/holder/role.
func grid(t *testing.T, h *heatmap.History, d *datadriven.TestData) string {
	q := heatmap.Query{From: uint64(intArg(t, d, "from", 0)), To: uint64(intArg(t, d, "to", 0)), W: intArg(t, d, "w", 1), H: intArg(t, d, "h", 4),
		Range: keyspace.Full(), Node: assignment.NodeID(stringArg(t, d, "node", ""))}
	if lo := stringArg(t, d, "lo", ""); lo != "" {
		q.Range = keyspace.Range{Start: point(t, lo), End: keyspace.At(point(t, stringArg(t, d, "hi", "")))}
	}
	g, err := h.Rasterize(q)
	if err != nil {
		return err.Error()
	}
	var out strings.Builder
	fmt.Fprintf(&out, "columns %d..%d max %g nodes %v\n", g.From, g.To, g.MaxLoad, g.Nodes)
	for c := range q.W {
		fmt.Fprintf(&out, "seq %d:", g.Seqs[c])
		for r := range q.H {
			i := c*q.H + r
			holder := "-"
			if g.Holder[i] >= 0 {
				holder = g.Nodes[g.Holder[i]]
			}
			fmt.Fprintf(&out, " %g/%s/%d", g.Load[i], holder, g.Role[i])
		}
		out.WriteString("\n")
	}
	return out.String()
}

func parseMap(t *testing.T, input string) (*assignment.Assignment, []float64) {
	var ss []assignment.Slice
	var loads []float64
	for _, line := range strings.Split(strings.TrimSpace(input), "\n") {
		f := strings.Fields(line)
		s := assignment.Slice{Range: keyspace.Range{Start: point(t, f[0]), End: keyspace.End}}
		for _, r := range strings.Split(f[1], ",") {
			id := assignment.NodeID(strings.TrimRight(r, "*~"))
			s.Replicas = append(s.Replicas, id)
			if strings.HasSuffix(r, "*") {
				s.Primary = id
			}
			if strings.HasSuffix(r, "~") {
				s.Loading, s.Since = append(s.Loading, id), 1
			}
		}
		if n := len(ss); n > 0 {
			ss[n-1].Range.End = keyspace.At(s.Range.Start)
		}
		l, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			t.Fatal(err)
		}
		ss, loads = append(ss, s), append(loads, l)
	}
	a, err := assignment.New(1, ss)
	if err != nil {
		t.Fatal(err)
	}
	return a, loads
}

func point(t *testing.T, s string) uint64 {
	p, err := keyspace.ParsePoint(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

func stringArg(t *testing.T, d *datadriven.TestData, key, def string) string {
	if !d.HasArg(key) {
		return def
	}
	var v string
	d.ScanArgs(t, key, &v)
	return v
}
