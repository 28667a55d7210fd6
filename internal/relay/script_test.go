package relay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// TestScripts runs the relay's scripts in testdata/: quanta as the relay's driver receives
// them, and watchers of the relay. Regenerate expectations with
//
//	go test ./internal/relay -run TestScripts -rewrite
//
// and review the diff. Commands:
//
//	take pos=T.S reinit [node=N]  a reinitializing quantum: 4 slices, all on N (default a)
//	take pos=T.S move=N [gen=G]   slice 0 moves to N; the quantum says generation G
//	                              (default: the one the move leads to)
//	take pos=T.S clock            a clock-only quantum
//	watch w=W [from=T.S]          W starts watching, after from
//	next w=W                      what W receives next, or "waits" if nothing is due
//	show                          the relay's position, generation and slice 0's holders
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		r := New()
		watchers := map[string]*quantum.Subscription{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "take":
				return take(t, r, d)
			case "watch":
				var from *quantum.Position
				if d.HasArg("from") {
					p := position(t, d, "from")
					from = &p
				}
				watchers[arg(d, "w")] = r.Feed().Hub().Subscribe(from, true)
				return "ok\n"
			case "next":
				return receive(watchers[arg(d, "w")])
			case "show":
				m, pos, _ := r.Feed().Hub().Current()
				if m == nil {
					return "no map\n"
				}
				return fmt.Sprintf("%s gen %d slice 0 on %v\n", pos, m.Generation(), m.Slice(0).Replicas)
			}
			t.Fatalf("unknown command %s", d.Cmd)
			return ""
		})
	})
}

func arg(d *datadriven.TestData, key string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key && len(a.Vals) > 0 {
			return a.Vals[0]
		}
	}
	return ""
}

func position(t *testing.T, d *datadriven.TestData, key string) quantum.Position {
	term, seq, ok := strings.Cut(arg(d, key), ".")
	tn, err1 := strconv.ParseUint(term, 10, 64)
	sn, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("%s: want T.S, got %s", key, arg(d, key))
	}
	return quantum.Position{Term: tn, Seq: sn}
}

func take(t *testing.T, r *Relay, d *datadriven.TestData) string {
	q := quantum.Quantum{Position: position(t, d, "pos"), Clock: 1, Cause: "pass"}
	cur, _, _ := r.Feed().Hub().Current()
	switch {
	case d.HasArg("reinit"):
		node := "a"
		if d.HasArg("node") {
			node = arg(d, "node")
		}
		m, err := assignment.Uniform(4, func(int) []assignment.NodeID { return []assignment.NodeID{assignment.NodeID(node)} })
		if err != nil {
			t.Fatal(err)
		}
		q.Snapshot, q.Generation, q.Cause = m, m.Generation(), "reinit"
	case d.HasArg("move"):
		q.Ops = []assignment.Op{assignment.Assign{Slice: 0, Replicas: []assignment.NodeID{assignment.NodeID(arg(d, "move"))}}}
		q.Generation = 1
		if cur != nil {
			q.Generation = cur.Generation() + 1
		}
		if d.HasArg("gen") {
			g, _ := strconv.ParseUint(arg(d, "gen"), 10, 64)
			q.Generation = g
		}
	}
	out, err := r.Take(q)
	if err != nil {
		return fmt.Sprintf("error: %v\n", err)
	}
	return out.String() + "\n"
}

func receive(s *quantum.Subscription) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	q, err := s.Next(ctx)
	switch {
	case err != nil:
		return "waits\n"
	case q.Reinitializing():
		return fmt.Sprintf("%s reinit gen %d slice 0 on %v\n", q.Position, q.Generation, q.Snapshot.Slice(0).Replicas)
	case q.ClockOnly():
		return fmt.Sprintf("%s clock\n", q.Position)
	}
	return fmt.Sprintf("%s ops %d gen %d\n", q.Position, len(q.Ops), q.Generation)
}
