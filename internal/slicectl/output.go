package slicectl

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// printer writes results as --output says: JSON, YAML, or (left to the caller) a table. The
// JSON and YAML forms of a result come from one struct with json tags, so that both have the
// same field names, in the same order.
type printer struct {
	w      io.Writer
	format string
	docs   int // YAML documents written, to separate the next one
}

func newPrinter(w io.Writer, format string) *printer { return &printer{w: w, format: format} }

func (p *printer) table() bool { return p.format == "table" }

// print writes v as one indented JSON value or one YAML document.
func (p *printer) print(v any) error { return p.write(v, true) }

// line writes v as one line of JSON (JSON Lines, for results that stream) or one YAML
// document.
func (p *printer) line(v any) error { return p.write(v, false) }

func (p *printer) write(v any, indent bool) error {
	switch p.format {
	case "json":
		enc := json.NewEncoder(p.w)
		if indent {
			enc.SetIndent("", "  ")
		}
		return enc.Encode(v)
	case "yaml":
		b, err := toYAML(v)
		if err != nil {
			return err
		}
		if p.docs > 0 {
			if _, err := io.WriteString(p.w, "---\n"); err != nil {
				return err
			}
		}
		p.docs++
		_, err = p.w.Write(b)
		return err
	}
	return fmt.Errorf("slicectl: no %s form of %T", p.format, v) // callers print tables themselves
}

// toYAML converts v to YAML by way of its JSON form: the json tags name the fields, and the
// order of the fields is kept.
func toYAML(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var n yaml.Node
	if err := yaml.Unmarshal(j, &n); err != nil { // JSON is YAML
		return nil, fmt.Errorf("slicectl: converting to YAML: %w", err)
	}
	blockStyle(&n)
	return yaml.Marshal(&n)
}

// blockStyle drops the flow style and quoting that parsing JSON gives every node; the encoder
// then quotes only the strings that need it.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// newTable returns a writer of aligned columns, separated by tabs; Flush writes them.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// row writes cells as one line of a table.
func row(w io.Writer, cells ...string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// jsonRange is a range of the hash space: points as FormatPoint writes them, end "end" for the
// end of the space, as ParseBound reads them.
type jsonRange struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

func rangeJSON(r *pb.Range) jsonRange {
	rg := rangeOf(r)
	return jsonRange{Start: keyspace.FormatPoint(rg.Start), End: rg.End.String()}
}

// rangeOf decodes a range as the assigner sends it.
func rangeOf(r *pb.Range) keyspace.Range {
	out := keyspace.Range{Start: r.GetStart(), End: keyspace.At(r.GetEnd())}
	if r.GetEndOfSpace() {
		out.End = keyspace.End
	}
	return out
}

func showRange(r *pb.Range) string { return rangeOf(r).String() }

type jsonPosition struct {
	Term uint64 `json:"term"`
	Seq  uint64 `json:"seq"`
}

func positionJSON(p *pb.Position) jsonPosition {
	return jsonPosition{Term: p.GetTerm(), Seq: p.GetSeq()}
}

// showPosition writes a position as term/seq.
func showPosition(p *pb.Position) string { return fmt.Sprintf("%d/%d", p.GetTerm(), p.GetSeq()) }

// jsonOp is one operation on the map. Op is split, merge or assign; the other fields are
// those of that operation.
type jsonOp struct {
	Op       string   `json:"op"`
	Slice    string   `json:"slice,omitempty"`
	At       string   `json:"at,omitempty"`
	Left     string   `json:"left,omitempty"`
	Replicas []string `json:"replicas,omitempty"`
}

func opsJSON(ops []*pb.Op) []jsonOp {
	out := make([]jsonOp, 0, len(ops))
	for _, op := range ops {
		switch o := op.GetOp().(type) {
		case *pb.Op_Split:
			out = append(out, jsonOp{Op: "split", Slice: keyspace.FormatPoint(o.Split.GetSlice()), At: keyspace.FormatPoint(o.Split.GetAt())})
		case *pb.Op_Merge:
			out = append(out, jsonOp{Op: "merge", Left: keyspace.FormatPoint(o.Merge.GetLeft())})
		case *pb.Op_Assign:
			out = append(out, jsonOp{Op: "assign", Slice: keyspace.FormatPoint(o.Assign.GetSlice()), Replicas: o.Assign.GetReplicas().GetNodes()})
		default:
			out = append(out, jsonOp{Op: "unknown"})
		}
	}
	return out
}

// showOp writes an operation as a sentence.
func showOp(op *pb.Op) string {
	switch o := op.GetOp().(type) {
	case *pb.Op_Split:
		return fmt.Sprintf("split the slice at %s at %s", keyspace.FormatPoint(o.Split.GetSlice()), keyspace.FormatPoint(o.Split.GetAt()))
	case *pb.Op_Merge:
		return fmt.Sprintf("merge the slice at %s with the next one", keyspace.FormatPoint(o.Merge.GetLeft()))
	case *pb.Op_Assign:
		return fmt.Sprintf("assign the slice at %s to %s", keyspace.FormatPoint(o.Assign.GetSlice()), showNodes(o.Assign.GetReplicas().GetNodes()))
	}
	return "unknown operation"
}

func showNodes(ids []string) string {
	if len(ids) == 0 {
		return "-"
	}
	return strings.Join(ids, ",")
}

// jsonTime writes a timestamp in RFC 3339, or nothing when unset.
func jsonTime(t *timestamppb.Timestamp) *time.Time {
	if t == nil {
		return nil
	}
	tt := t.AsTime()
	return &tt
}

// showTime writes a timestamp in local time, with how long ago it was.
func showTime(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "never"
	}
	tt := t.AsTime()
	return tt.Local().Format("2006-01-02 15:04:05.000") + " (" + ago(tt, now) + ")"
}

// ago writes how long before now t was, rounded for reading.
func ago(t, now time.Time) string {
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Second:
		return d.Round(time.Millisecond).String() + " ago"
	case d < time.Minute:
		return d.Round(100*time.Millisecond).String() + " ago"
	}
	return d.Round(time.Second).String() + " ago"
}

// jsonFloat is a measure in JSON. JSON has no NaN or infinities; like the protobuf JSON
// mapping, it writes them as the strings "NaN", "Infinity" and "-Infinity", so that output
// never fails on them (the assigner refuses the input that could make them, but an older
// assigner or a bug must not make slicectl fail).
type jsonFloat float64

// MarshalJSON implements json.Marshaler.
func (f jsonFloat) MarshalJSON() ([]byte, error) {
	x := float64(f)
	switch {
	case math.IsNaN(x):
		return []byte(`"NaN"`), nil
	case math.IsInf(x, 1):
		return []byte(`"Infinity"`), nil
	case math.IsInf(x, -1):
		return []byte(`"-Infinity"`), nil
	}
	return json.Marshal(x)
}

// num writes a load, imbalance or other measure with up to 4 significant digits, and large
// ones whole.
func num(f float64) string {
	if math.Abs(f) >= 1e4 {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'g', 4, 64)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
