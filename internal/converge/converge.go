// Package converge checks invariant I3 at rest: every node holds exactly the items of the
// source that lie in its slices, with their current values and fragments; nothing lost,
// nothing leaked, nothing stale.
package converge

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// Problem is one way a node differs from what it must hold.
type Problem struct {
	Node assignment.NodeID
	// Kind is "missing" (an item the node must hold and does not), "leaked" (an item it holds
	// and must not), "stale" (an item whose value or fragments differ) or "slices" (the
	// points it holds differ from its slices).
	Kind   string
	Key    []byte
	Detail string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s: %s %q: %s", p.Node, p.Kind, p.Key, p.Detail)
}

// Report is the outcome of a check.
type Report struct {
	// Items is the number of items in the source; Copies the number of item copies the
	// nodes must hold (items times replicas).
	Items, Copies int
	Problems      []Problem
	// Counts of problems by kind (Problems keeps only the first few).
	Missing, Leaked, Stale, Slices int
}

// OK reports whether the nodes hold exactly what they must.
func (r Report) OK() bool { return r.Missing+r.Leaked+r.Stale+r.Slices == 0 }

func (r Report) String() string {
	if r.OK() {
		return fmt.Sprintf("converged: %d items, %d copies", r.Items, r.Copies)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "not converged: %d items, %d copies; %d missing, %d leaked, %d stale, %d slice mismatches",
		r.Items, r.Copies, r.Missing, r.Leaked, r.Stale, r.Slices)
	for _, p := range r.Problems {
		b.WriteString("\n  " + p.String())
	}
	return b.String()
}

// maxProblems bounds the problems a report lists.
const maxProblems = 20

func (r *Report) add(p Problem) {
	switch p.Kind {
	case "missing":
		r.Missing++
	case "leaked":
		r.Leaked++
	case "stale":
		r.Stale++
	case "slices":
		r.Slices++
	}
	if len(r.Problems) < maxProblems {
		r.Problems = append(r.Problems, p)
	}
}

// Check compares what the nodes hold with the source as of clock and the map a. Every node
// named in a must be in nodes; nodes not in a must hold nothing. A quarantined range, held by
// assignment.Nobody, must be held by no node.
func Check(ctx context.Context, src source.Source, clock uint64, a *assignment.Assignment, nodes map[assignment.NodeID]client.Reader) (Report, error) {
	var r Report
	for _, s := range a.All() {
		for _, id := range s.Replicas {
			if nodes[id] == nil && id != assignment.Nobody {
				return Report{}, fmt.Errorf("converge: node %s holds %s in the map, but was not given", id, s.Range)
			}
		}
	}
	want := map[assignment.NodeID]map[string]source.Item{}
	ranges := map[assignment.NodeID][]keyspace.Range{}
	for id := range nodes {
		want[id] = map[string]source.Item{}
	}
	for _, s := range a.All() {
		for _, id := range s.Replicas {
			ranges[id] = append(ranges[id], s.Range)
		}
	}
	delete(ranges, assignment.Nobody)
	_, err := src.Scan(ctx, keyspace.Full(), clock, func(it source.Item) error {
		r.Items++
		_, s := a.Lookup(it.Hash)
		for _, id := range s.Replicas {
			if id != assignment.Nobody {
				want[id][string(it.Key)] = it
				r.Copies++
			}
		}
		return nil
	})
	if err != nil {
		return Report{}, fmt.Errorf("converge: scanning the source at %d: %w", clock, err)
	}
	for _, id := range slices.Sorted(maps.Keys(nodes)) {
		if err := checkNode(ctx, &r, id, nodes[id], want[id], keyspace.NewSet(ranges[id]...)); err != nil {
			return Report{}, err
		}
	}
	return r, nil
}

func checkNode(ctx context.Context, r *Report, id assignment.NodeID, node client.Reader, want map[string]source.Item, cover keyspace.Set) error {
	held, err := node.Slices(ctx)
	if err != nil {
		return fmt.Errorf("converge: the slices of %s: %w", id, err)
	}
	if got := setOf(held); !got.Equal(cover) {
		r.add(Problem{Node: id, Kind: "slices", Detail: fmt.Sprintf("holds %s, must hold %s", got, cover)})
	}
	seen := map[string]bool{}
	err = node.Items(ctx, func(it client.Item) error {
		k := string(it.Key)
		seen[k] = true
		w, ok := want[k]
		if !ok {
			r.add(Problem{Node: id, Kind: "leaked", Key: it.Key, Detail: fmt.Sprintf("hash %s is not in its slices, or the item is gone", keyspace.FormatPoint(client.Hash(it.Key)))})
			return nil
		}
		if d := differ(w, it); d != "" {
			r.add(Problem{Node: id, Kind: "stale", Key: it.Key, Detail: d})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("converge: the items of %s: %w", id, err)
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if !seen[k] {
			r.add(Problem{Node: id, Kind: "missing", Key: []byte(k), Detail: "in the source and in its slices"})
		}
	}
	return nil
}

// differ says how a node's copy of an item differs from the source's, or "".
func differ(want source.Item, got client.Item) string {
	switch {
	case want.Exists != got.HasValue:
		return fmt.Sprintf("has value %v, the source %v", got.HasValue, want.Exists)
	case !bytes.Equal(want.Value, got.Value):
		return fmt.Sprintf("value %q, the source %q", got.Value, want.Value)
	case len(want.Fragments) != len(got.Fragments):
		return fmt.Sprintf("%d fragments, the source %d", len(got.Fragments), len(want.Fragments))
	}
	byID := map[string][]byte{}
	for _, f := range got.Fragments {
		byID[f.ID] = f.Value
	}
	for _, f := range want.Fragments {
		v, ok := byID[f.ID]
		switch {
		case !ok:
			return fmt.Sprintf("fragment %q missing", f.ID)
		case !bytes.Equal(v, f.Value):
			return fmt.Sprintf("fragment %q is %q, the source %q", f.ID, v, f.Value)
		}
	}
	return ""
}

// setOf returns the points of the slices a node lists.
func setOf(held []client.Range) keyspace.Set {
	rs := make([]keyspace.Range, len(held))
	for i, h := range held {
		rs[i] = keyspace.Range{Start: h.Start, End: keyspace.End}
		if !h.End.IsEnd() {
			rs[i].End = keyspace.At(h.End.Point())
		}
	}
	return keyspace.NewSet(rs...)
}
