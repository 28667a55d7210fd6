package balance_test

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/cockroachdb/datadriven"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
)

// TestScripts runs the balancer scripts in testdata/. Regenerate expectations with
//
//	go test ./internal/balance -run TestScripts -rewrite
//
// and review the diff. Commands (every argument must be used, or the test fails):
//
//	nodes                  input: one node per line, "ID [cap=C] [zone=Z]"; replaces the live
//	                       node set; with a zone on any node, passes spread replicas over zones
//	uniform n=N nodes=a,b  N equal slices dealt to the listed nodes in turn
//	slices                 input: one slice per line, "START REPLICAS"; START is 0x-hex, decimal
//	                       or i/n (the i-th of n equal boundaries); REPLICAS is a,b
//	load                   input: whitespace-separated loads, one per slice in order
//	keys                   input: whitespace-separated key counts, one per slice in order
//	spread                 input: whitespace-separated standard deviations of the loads,
//	                       one per slice in order (Input.Spread)
//	hot                    input: lines "SLICE HASH:LOAD ..." (slice index; HASH as START)
//	pin                    input: slice indexes whose ranges are pinned (replaces earlier pins)
//	initial [algorithm=A] [k=v ...]    the algorithm's first assignment over the nodes
//	rebalance [algorithm=A] [k=v ...]  one pass: prints its ops and explanation, applies them;
//	                       loads and key counts follow the slices they were measured on
//	explain                the candidates the last pass weighed
//	zones                  each multi-replica slice's zones, and those short of distinct zones
//	show                   the slices and the nodes
//
// The algorithm defaults to weighted-move; other arguments are its parameters.
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := h.run(d)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			if unread := d.CmdArgs; len(unread) > 0 {
				t.Fatalf("%s: unused arguments %v", d.Pos, unread)
			}
			return out
		})
	})
}

type harness struct {
	nodes   *assignment.NodeSet
	a       *assignment.Assignment
	loads   []float64
	keys    []float64
	spread  []float64
	hot     [][]balance.HotKey
	pass    uint64
	history []balance.Move
	pins    []keyspace.Range
	zones   map[assignment.NodeID]string
	last    balance.Explanation
}

// take removes and returns the value of argument key, or def if it is absent.
func take(d *datadriven.TestData, key, def string) string {
	for i, a := range d.CmdArgs {
		if a.Key == key {
			d.CmdArgs = slices.Delete(d.CmdArgs, i, i+1)
			return strings.Join(a.Vals, ",")
		}
	}
	return def
}

// params takes every remaining argument as an algorithm parameter.
func params(d *datadriven.TestData) map[string]string {
	out := make(map[string]string)
	for _, a := range d.CmdArgs {
		out[a.Key] = strings.Join(a.Vals, ",")
	}
	d.CmdArgs = nil
	return out
}

// commands maps each script command to its handler.
var commands = map[string]func(*harness, *datadriven.TestData) (string, error){
	"nodes":     (*harness).cmdNodes,
	"uniform":   (*harness).cmdUniform,
	"slices":    (*harness).cmdSlices,
	"load":      (*harness).cmdLoadOrKeys,
	"keys":      (*harness).cmdLoadOrKeys,
	"spread":    (*harness).cmdSpread,
	"hot":       (*harness).cmdHot,
	"pin":       (*harness).cmdPin,
	"initial":   (*harness).cmdInitial,
	"rebalance": (*harness).cmdRebalance,
	"explain":   (*harness).cmdExplain,
	"show":      (*harness).cmdShow,
	"zones":     func(h *harness, _ *datadriven.TestData) (string, error) { return h.showZones(), nil },
}

func (h *harness) run(d *datadriven.TestData) (string, error) {
	cmd, ok := commands[d.Cmd]
	if !ok {
		return "", fmt.Errorf("unknown command %q", d.Cmd)
	}
	return cmd(h, d)
}

func (h *harness) cmdNodes(d *datadriven.TestData) (string, error) {
	var ns []assignment.Node
	h.zones = nil
	for _, line := range lines(d.Input) {
		f := strings.Fields(line)
		n := assignment.Node{ID: assignment.NodeID(f[0])}
		for _, kv := range f[1:] {
			if z, ok := strings.CutPrefix(kv, "zone="); ok {
				h.setZone(n.ID, z)
				continue
			}
			v, ok := strings.CutPrefix(kv, "cap=")
			if !ok {
				return "", fmt.Errorf("bad node attribute %q", kv)
			}
			c, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return "", err
			}
			n.Capacity = c
		}
		ns = append(ns, n)
	}
	set, err := assignment.NewNodeSet(ns)
	if err != nil {
		return "", err
	}
	h.nodes = set
	return "ok\n", nil
}

func (h *harness) cmdUniform(d *datadriven.TestData) (string, error) {
	n, err := strconv.Atoi(take(d, "n", ""))
	if err != nil {
		return "", err
	}
	owners := strings.Split(take(d, "nodes", ""), ",")
	a, err := assignment.Uniform(n, func(i int) []assignment.NodeID {
		return []assignment.NodeID{assignment.NodeID(owners[i%len(owners)])}
	})
	if err != nil {
		return "", err
	}
	h.setAssignment(a)
	return h.show(), nil
}

func (h *harness) cmdSlices(d *datadriven.TestData) (string, error) {
	var starts []uint64
	var reps [][]assignment.NodeID
	for _, line := range lines(d.Input) {
		f := strings.Fields(line)
		p, err := point(f[0])
		if err != nil {
			return "", err
		}
		starts = append(starts, p)
		reps = append(reps, nodeList(f[1]))
	}
	var ss []assignment.Slice
	for i, s := range starts {
		end := keyspace.End
		if i+1 < len(starts) {
			end = keyspace.At(starts[i+1])
		}
		ss = append(ss, assignment.Slice{Range: keyspace.Range{Start: s, End: end}, Replicas: reps[i]})
	}
	a, err := assignment.New(0, ss)
	if err != nil {
		return "", err
	}
	h.setAssignment(a)
	return h.show(), nil
}

func (h *harness) cmdLoadOrKeys(d *datadriven.TestData) (string, error) {
	xs, err := numbers(d.Input, h.a.Len())
	if err != nil {
		return "", err
	}
	if d.Cmd == "load" {
		h.loads = xs
	} else {
		h.keys = xs
	}
	return h.show(), nil
}

func (h *harness) cmdSpread(d *datadriven.TestData) (string, error) {
	xs, err := numbers(d.Input, h.a.Len())
	if err != nil {
		return "", err
	}
	h.spread = xs
	return "ok\n", nil
}

func (h *harness) cmdHot(d *datadriven.TestData) (string, error) {
	h.hot = make([][]balance.HotKey, h.a.Len())
	for _, line := range lines(d.Input) {
		f := strings.Fields(line)
		i, err := strconv.Atoi(f[0])
		if err != nil {
			return "", err
		}
		for _, kv := range f[1:] {
			hs, ls, _ := strings.Cut(kv, ":")
			hash, err := point(hs)
			if err != nil {
				return "", err
			}
			l, err := strconv.ParseFloat(ls, 64)
			if err != nil {
				return "", err
			}
			h.hot[i] = append(h.hot[i], balance.HotKey{Hash: hash, Load: l})
		}
	}
	return "ok\n", nil
}

func (h *harness) cmdPin(d *datadriven.TestData) (string, error) {
	h.pins = nil
	for _, f := range strings.Fields(d.Input) {
		i, err := strconv.Atoi(f)
		if err != nil {
			return "", err
		}
		h.pins = append(h.pins, h.a.Slice(i).Range)
	}
	return "ok\n", nil
}

func (h *harness) cmdInitial(d *datadriven.TestData) (string, error) {
	alg, err := balance.New(take(d, "algorithm", "weighted-move"), params(d))
	if err != nil {
		return "", err
	}
	a, err := alg.Initial(balance.Input{Nodes: h.nodes})
	if err != nil {
		return "", err
	}
	h.setAssignment(a)
	return h.show(), nil
}

func (h *harness) cmdRebalance(d *datadriven.TestData) (string, error) {
	alg, err := balance.New(take(d, "algorithm", "weighted-move"), params(d))
	if err != nil {
		return "", err
	}
	res, err := alg.Rebalance(balance.Input{
		Assignment: h.a, Nodes: h.nodes, Load: h.loads, Spread: h.spread, Keys: h.keys, HotKeys: h.hot,
		Pass: h.pass, History: h.history, Pinned: h.pins, Zones: h.zones,
	})
	if err != nil {
		return "", err
	}
	next, err := h.a.Apply(res.Ops)
	if err != nil {
		return "", fmt.Errorf("ops do not apply: %w", err)
	}
	if err := next.Validate(h.nodes); err != nil {
		return "", fmt.Errorf("result breaks an invariant: %w", err)
	}
	var b strings.Builder
	for _, op := range res.Ops {
		fmt.Fprintln(&b, op)
	}
	x := res.Explanation
	fmt.Fprintf(&b, "imbalance %.3f -> %.3f; churn %.4f (cleanup %.4f merge %.4f move %.4f, budget %.4f)\n",
		x.ImbalanceBefore, x.ImbalanceAfter, x.Churn.Total(), x.Churn.Cleanup, x.Churn.Merge, x.Churn.Move, x.ChurnBudget)
	fmt.Fprintf(&b, "splits %d merges %d moves %d replicas +%d -%d reassigned %d\n",
		x.Splits, x.Merges, x.Moves, x.ReplicasAdded, x.ReplicasRemoved, x.Reassigned)
	if x.Spreads > 0 {
		fmt.Fprintf(&b, "spreads %d\n", x.Spreads)
	}
	fmt.Fprintf(&b, "stop: %s\n", x.Stop)
	if h.loads, err = load.Reproject(h.a, h.loads, next); err != nil {
		return "", err
	}
	if h.keys, err = load.Reproject(h.a, h.keys, next); err != nil {
		return "", err
	}
	if h.spread, err = load.Reproject(h.a, h.spread, next); err != nil {
		return "", err
	}
	h.hot = nil
	h.a, h.history, h.last = next, res.History, x
	h.pass++
	b.WriteString(h.show())
	return b.String(), nil
}

func (h *harness) cmdExplain(d *datadriven.TestData) (string, error) {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "action\tslice\tfrom\tto\tgain\tcost\tchosen\treason")
	for _, c := range h.last.Candidates {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.3f\t%.4f\t%v\t%s\n", c.Action, c.Slice, c.From, assignment.FormatReplicas(c.To), c.Gain, c.Cost, c.Chosen, c.Reason)
	}
	w.Flush()
	return b.String(), nil
}

func (h *harness) cmdShow(d *datadriven.TestData) (string, error) {
	return h.show(), nil
}

// setAssignment starts over on map a: the moves made on an earlier map of the script do not
// hold on it.
func (h *harness) setAssignment(a *assignment.Assignment) {
	h.a, h.loads, h.keys, h.spread, h.hot, h.history = a, nil, nil, nil, nil, nil
}

func (h *harness) show() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "slice\trange\treplicas\tload\tkeys")
	for i, s := range h.a.All() {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", i, s.Range, assignment.FormatReplicas(s.Replicas), at(h.loads, i), at(h.keys, i))
	}
	w.Flush()
	if h.nodes == nil {
		return b.String()
	}
	loads := h.loads
	if loads == nil {
		loads = make([]float64, h.a.Len())
	}
	util := load.NodeLoads(h.a, loads, h.nodes)
	w = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "node\tcap\tslices\tload/cap")
	for n, node := range h.nodes.Nodes() {
		count := 0
		for _, s := range h.a.All() {
			if s.Holds(node.ID) {
				count++
			}
		}
		fmt.Fprintf(w, "%s\t%g\t%d\t%.2f\n", node.ID, node.Weight(), count, util[n])
	}
	w.Flush()
	fmt.Fprintf(&b, "imbalance %.3f\n", load.Imbalance(util))
	return b.String()
}

func at(xs []float64, i int) string {
	if xs == nil {
		return "-"
	}
	return strconv.FormatFloat(math.Round(xs[i]*100)/100, 'f', -1, 64)
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func numbers(s string, want int) ([]float64, error) {
	var out []float64
	for _, f := range strings.Fields(s) {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	if len(out) != want {
		return nil, fmt.Errorf("%d values for %d slices", len(out), want)
	}
	return out, nil
}

// point parses a point as keyspace.ParsePoint does, or as i/n.
func point(s string) (uint64, error) {
	if i, n, ok := strings.Cut(s, "/"); ok {
		a, err1 := strconv.Atoi(i)
		b, err2 := strconv.Atoi(n)
		if err1 != nil || err2 != nil || a < 0 || a >= b {
			return 0, fmt.Errorf("bad fraction %q", s)
		}
		return keyspace.Boundary(a, b), nil
	}
	return keyspace.ParsePoint(s)
}

func nodeList(s string) []assignment.NodeID {
	var out []assignment.NodeID
	for _, id := range strings.Split(s, ",") {
		out = append(out, assignment.NodeID(id))
	}
	return out
}
