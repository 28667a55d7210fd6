package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// FuzzReadTrace checks that a trace the simulator accepts is one it can run: sorted epochs
// that the run's epoch count can reach, finite non-negative loads, positive capacities,
// well-formed node IDs, and that the accepted events read back the same once written out.
func FuzzReadTrace(f *testing.F) {
	for _, s := range []string{
		`{"epoch":0,"key":"a","load":2}` + "\n" + `{"epoch":1,"add_node":"big","capacity":2.5}` + "\n" +
			`{"epoch":2,"delete_key":"a"}` + "\n" + `{"epoch":2,"remove_node":"n0"}` + "\n" + `{"epoch":3,"add_node":"small"}`,
		`{"epoch":0,"add_node":"x"}`,
		`{"epoch":0,"add_node":"x","labels":{"zone":"a"}}`,
		"\n\n  \n",
		`{"epoch":0,"key":"","load":1e308}`,
		`{"epoch":0,"key":"a","load":1,"delete_key":"b"}`,
		`{"epoch":0,"key":"a","load":-0}`,
		`{"epoch":9223372036854775807,"key":"a","load":1}`,
		`{"epoch":3,"key":"a","load":1}` + "\n" + `{"epoch":2,"key":"b","load":1}`,
		`{"epoch":0,"add_node":"x y"}`,
		`{"epoch":0,"key":"a","load":1} {"epoch":1}`,
		`{"epoch":1e2,"key":"a","load":1}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		initial := []assignment.NodeID{"n0", "n1"}
		tr, err := ReadTrace(strings.NewReader(s), initial)
		if err != nil {
			return
		}
		checkTrace(t, tr)
		var out bytes.Buffer
		for _, ev := range tr.Events {
			writeEvent(t, &out, ev)
		}
		back, err := ReadTrace(&out, initial)
		if err != nil {
			t.Fatalf("the accepted trace, written out, is refused: %v\n%s", err, out.String())
		}
		if len(back.Events) != len(tr.Events) || back.LastEpoch != tr.LastEpoch || back.NodesAtStart != tr.NodesAtStart {
			t.Fatalf("round trip: %+v became %+v", tr, back)
		}
		for i, ev := range tr.Events {
			ev.Line = back.Events[i].Line
			if !reflect.DeepEqual(ev, back.Events[i]) {
				t.Fatalf("round trip: event %d %+v became %+v", i, ev, back.Events[i])
			}
		}
	})
}

func checkTrace(t *testing.T, tr *Trace) {
	t.Helper()
	if tr.LastEpoch+1 <= tr.LastEpoch || tr.LastEpoch > MaxEpoch {
		t.Fatalf("last epoch %d: a run cannot count up to it", tr.LastEpoch)
	}
	last, line, atStart := -1, 0, false
	for _, ev := range tr.Events {
		if ev.Epoch < last || ev.Line <= line {
			t.Fatalf("event %+v comes after epoch %d, line %d", ev, last, line)
		}
		last, line = ev.Epoch, ev.Line
		atStart = atStart || ev.Kind == AddNode && ev.Epoch == 0
		switch ev.Kind {
		case SetLoad:
			if !(ev.Value >= 0) || math.IsInf(ev.Value, 0) {
				t.Fatalf("accepted %+v", ev)
			}
		case AddNode, RemoveNode:
			if err := assignment.NodeID(ev.Name).Validate(); err != nil {
				t.Fatalf("accepted %+v: %v", ev, err)
			}
			if ev.Kind == AddNode && (!(ev.Value > 0) || math.IsInf(ev.Value, 0)) {
				t.Fatalf("accepted %+v", ev)
			}
		case DeleteKey:
		default:
			t.Fatalf("accepted %+v, of kind %d", ev, ev.Kind)
		}
	}
	if last != tr.LastEpoch || atStart != tr.NodesAtStart {
		t.Fatalf("trace says last epoch %d, nodes at start %v; its events say %d, %v", tr.LastEpoch, tr.NodesAtStart, last, atStart)
	}
}

// writeEvent writes ev as a trace line.
func writeEvent(t *testing.T, w *bytes.Buffer, ev Event) {
	t.Helper()
	line := map[string]any{"epoch": ev.Epoch}
	switch ev.Kind {
	case SetLoad:
		line["key"], line["load"] = ev.Name, ev.Value
	case DeleteKey:
		line["delete_key"] = ev.Name
	case AddNode:
		line["add_node"], line["capacity"] = ev.Name, ev.Value
		if ev.Labels != nil {
			line["labels"] = ev.Labels
		}
	case RemoveNode:
		line["remove_node"] = ev.Name
	}
	b, err := json.Marshal(line)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(append(b, '\n'))
}
