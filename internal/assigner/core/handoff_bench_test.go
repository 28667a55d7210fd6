package core

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/load"
)

// BenchmarkCorePass measures the core's balancing pass (the algorithm, and with
// make-before-break the view of the slices in handoff, then the change it proposes, not its
// write) over 1,000 nodes holding 150 slices each (150k slices) with Zipf(1.1) loads, with no
// slice in handoff and with some. Target: <= 50 ms.
func BenchmarkCorePass(b *testing.B) {
	for _, v := range []struct {
		mbb      bool
		handoffs int
	}{{false, 0}, {true, 0}, {true, 300}, {true, 3000}} {
		b.Run(fmt.Sprintf("slices=150k/mbb=%t/handoffs=%d", v.mbb, v.handoffs), func(b *testing.B) {
			c, now := benchCore(b, 1000, 150, v.mbb, v.handoffs)
			for b.Loop() {
				if _, err := c.pass(now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchCore returns a leading core whose map has nodes*perNode slices, slice i on node
// i%nodes, the first handoffs of them moving to the next node, and whose nodes reported
// loads following Zipf(1.1) over a fixed permutation of the slices; and the time of the
// pass to run.
func benchCore(b *testing.B, nodes, perNode int, mbb bool, handoffs int) (*Core, time.Time) {
	b.Helper()
	ids := make([]assignment.NodeID, nodes)
	st := State{Meta: Meta{Algorithm: "weighted-move", Generation: 1}}
	for i := range ids {
		ids[i] = assignment.NodeID(fmt.Sprintf("n%04d", i))
		st.Nodes = append(st.Nodes, Node{Node: assignment.Node{ID: ids[i]}, Address: string(ids[i]) + ":1"})
	}
	n := nodes * perNode
	u, err := assignment.Uniform(n, func(i int) []assignment.NodeID { return ids[i%nodes : i%nodes+1] })
	if err != nil {
		b.Fatal(err)
	}
	ss := make([]assignment.Slice, n)
	for i, s := range u.All() {
		ss[i] = s
		if i < handoffs {
			from, to := ids[i%nodes], ids[(i+1)%nodes]
			ss[i].Replicas, ss[i].Loading, ss[i].Leaving, ss[i].Since = []assignment.NodeID{from, to}, []assignment.NodeID{to}, []assignment.NodeID{from}, 1
		}
	}
	if st.Assignment, err = assignment.New(1, ss); err != nil {
		b.Fatal(err)
	}
	c, err := New(Config{BreakBeforeMake: !mbb, Algorithm: "weighted-move"})
	if err != nil {
		b.Fatal(err)
	}
	now := t0
	c.Settle(now, LeadershipGained{Term: 1, State: st, Found: true})
	rank := rand.New(rand.NewPCG(1, 2)).Perm(n)
	reports := make([]load.Report, nodes)
	for i, s := range st.Assignment.All() {
		r := &reports[i%nodes]
		r.Samples = append(r.Samples, load.Sample{Range: s.Range, Load: math.Pow(float64(rank[i]+1), -1.1) * float64(n), Keys: 100})
	}
	for i := range reports {
		reports[i].Node, reports[i].Window = ids[i], time.Second
		if out := c.Step(now, ReportLoad{Report: reports[i]}); out.Reply == nil || out.Reply.Err != nil {
			b.Fatalf("report: %+v", out.Reply)
		}
	}
	return c, now.Add(time.Second)
}

// BenchmarkHandoffInput measures what make-before-break adds to a pass over 150k slices of
// which some are in handoff: the map the algorithm sees.
func BenchmarkHandoffInput(b *testing.B) {
	for _, handoffs := range []int{0, 300, 3000} {
		b.Run(fmt.Sprintf("slices=150k/handoffs=%d", handoffs), func(b *testing.B) {
			c, _ := benchCore(b, 1000, 150, true, handoffs)
			for b.Loop() {
				in := balance.Input{Pinned: c.meta.Pins}
				if _, err := c.handoffInput(&in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
