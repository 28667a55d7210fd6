package distributor

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/memsource"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// TestScripts runs the data path scripts in testdata/: an assigner, distributors and nodes
// driven step by step over an in-memory source, so that a script chooses the order in which
// each distributor hears of quanta and changes. Regenerate expectations with
//
//	go test ./internal/distributor -run TestScripts -rewrite
//
// and review the diff. Commands:
//
//	distributors IDS...     the assigner publishes the distributor set (a reinitializing
//	                        quantum); prints which distributor serves each node named so far
//	map                     input: "START REPLICAS" lines; the assigner publishes this map
//	write                   input: "put K V", "delete K", "putf K ID V", "deletef K ID" lines
//	quantum [clock=C]       input: "move START A,B", "split START AT", "merge LEFT" lines; the
//	                        assigner publishes them at clock C (default: the source's clock)
//	deliver d=D [quanta=N] [changes=N] [progress] [naive]
//	                        D hears of N more quanta and changes (default all), and of the
//	                        source's progress; naive applies them in arrival order, as a
//	                        distributor without a sequencer would
//	scan d=D [fail] [piece=N] [present]
//	                        D's pending scans run (or fail as compacted); with piece, each
//	                        scan its queue lets read on (applier.scanReady) delivers its next
//	                        N ops, the others wait, as the distributor's scanner does; with
//	                        present, each reads the source as it is now and is positioned at
//	                        the source's clock, as a source that cannot read the past
//	                        (PostgreSQL) scans
//	pull node=N             N pulls from its distributor and applies all it can
//	check                   every node against the source and the map (I3)
//	show d=D                D's clock and what it holds per node
//	restart node=N          N's stream ends (its data and cursor stay)
//	leader term=T           quanta from here on are of term T (default 1), starting with a
//	                        reinitializing quantum of the current map; a term lower than an
//	                        earlier one plays a deposed leader that still emits
//	wipe node=N             N restarts with an empty store
//	limit d=D [bytes=B] [ahead=B]
//	                        D's bound on a node's queue of changes, and on the scanned
//	                        items it holds ahead of the node
//
// Every node named in a map takes part; nodes start with an empty cursor. Under what
// deliver, scan and pull do, indented, are the actions the router returned, list after list,
// each in order, and the overflows of queues that made it return more. (A Publish is applied
// after the Restarts that answer its list's overflows.)
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		w := newWorld()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := w.run(d)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			return out
		})
	})
}

type world struct {
	src    *memsource.Source
	a      *assignment.Assignment
	dists  quantum.Distributors
	quanta []quantum.Quantum
	seq    uint64
	term   uint64
	ds     map[string]*scriptDist
	nodes  map[assignment.NodeID]*modelNode
}

// scriptDist is a distributor as a script drives it.
type scriptDist struct {
	seq     *Sequencer
	router  *Router
	app     *applier
	actions strings.Builder // the actions applied and not printed yet
	quanta  int             // quanta heard of
	clock   uint64          // source changes heard of, up to
	pending []ScanRequest
	// read holds what the scans delivered in pieces have still to deliver.
	read    map[uint64][]op
	streams map[assignment.NodeID]*Attached
}

func newScriptDist(id string, newEpoch func() uint64) *scriptDist {
	r := NewRouter(RouterConfig{ID: id, NewEpoch: newEpoch})
	ds := &scriptDist{router: r, app: newApplier(r), streams: map[assignment.NodeID]*Attached{}, read: map[uint64][]op{}}
	ds.app.trace = func(overflowed assignment.NodeID, acts []Action) {
		if overflowed != "" {
			fmt.Fprintf(&ds.actions, "  (%s's queue overflowed)\n", overflowed)
		}
		for _, a := range acts {
			fmt.Fprintf(&ds.actions, "  %s\n", formatAction(a))
		}
	}
	return ds
}

// flush returns the actions applied since the last call.
func (ds *scriptDist) flush() string {
	out := ds.actions.String()
	ds.actions.Reset()
	return out
}

// formatAction describes an action, its operation decoded.
func formatAction(a Action) string {
	switch a.Kind {
	case Enqueue:
		return fmt.Sprintf("enqueue %s: %s (gen %d)", a.Node, describeOp(a.Op), a.Op.gen)
	case Scan:
		return fmt.Sprintf("scan %s: scan %d of %s at clock %d", a.Node, a.Scan.ID, a.Scan.Range, a.Scan.Clock)
	case Fill:
		done := ""
		if a.Done {
			done = ", done"
		}
		return fmt.Sprintf("fill %s: scan %d, %d ops%s", a.Node, a.ScanID, len(a.Items), done)
	case Restart:
		if a.Epoch == 0 {
			return fmt.Sprintf("restart %s: no epoch", a.Node)
		}
		return fmt.Sprintf("restart %s: epoch %d", a.Node, a.Epoch)
	case Publish:
		return fmt.Sprintf("publish clock %d", a.Clock)
	}
	return fmt.Sprintf("%s %s", a.Kind, a.Node)
}

// describeOp decodes an operation, as a node does, and describes it.
func describeOp(o op) string {
	var resp pb.PullResponse
	if err := proto.Unmarshal(appendDelta(nil, 1, 0, 1, 0, 0, []op{o}, nil), &resp); err != nil {
		return "undecodable: " + err.Error()
	}
	return describeDeltaOp(resp.GetDelta().GetOps()[0])
}

func newWorld() *world {
	return &world{term: 1, src: memsource.New(), dists: quantum.Distributors{}, ds: map[string]*scriptDist{},
		nodes: map[assignment.NodeID]*modelNode{}}
}

func arg(d *datadriven.TestData, key string) (string, bool) {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			return strings.Join(a.Vals, ","), true
		}
	}
	return "", false
}

func intArg(d *datadriven.TestData, key string, def int) (int, error) {
	v, ok := arg(d, key)
	if !ok {
		return def, nil
	}
	return strconv.Atoi(v)
}

func (w *world) run(d *datadriven.TestData) (string, error) {
	cmds := map[string]func(*datadriven.TestData) (string, error){
		"distributors": w.cmdDistributors,
		"map":          w.cmdMap,
		"write":        w.cmdWrite,
		"quantum":      w.cmdQuantum,
		"deliver":      w.deliver,
		"leader":       w.cmdLeader,
		"scan":         w.scan,
		"pull":         w.cmdPull,
		"check":        w.cmdCheck,
		"restart":      w.cmdRestart,
		"wipe":         w.cmdWipe,
		"limit":        w.cmdLimit,
		"show":         w.cmdShow,
	}
	if cmd := cmds[d.Cmd]; cmd != nil {
		return cmd(d)
	}
	return "", fmt.Errorf("unknown command %q", d.Cmd)
}

// cmdDistributors runs "distributors": the assigner publishes the distributor set.
func (w *world) cmdDistributors(d *datadriven.TestData) (string, error) {
	set := quantum.Distributors{}
	for _, a := range d.CmdArgs {
		set[a.Key] = a.Key + ":addr"
		if w.ds[a.Key] == nil {
			var epochs uint64
			prefix := uint64(len(w.ds)+1) * 1000
			w.ds[a.Key] = newScriptDist(a.Key, func() uint64 { epochs++; return prefix + epochs })
		}
	}
	w.dists = set
	if w.a != nil {
		w.publish(quantum.Quantum{Snapshot: w.a, Distributors: set, Cause: "distributors"})
	}
	return w.serving(), nil
}

// cmdMap runs "map": the assigner publishes a map.
func (w *world) cmdMap(d *datadriven.TestData) (string, error) {
	var ss []assignment.Slice
	for line := range strings.Lines(d.Input) {
		f := strings.Fields(line)
		if len(f) != 2 {
			return "", fmt.Errorf("want START REPLICAS: %q", line)
		}
		start, err := keyspace.ParsePoint(f[0])
		if err != nil {
			return "", err
		}
		ss = append(ss, assignment.Slice{Range: keyspace.Range{Start: start}, Replicas: ids(f[1])})
	}
	for i := range ss {
		ss[i].Range.End = keyspace.End
		if i+1 < len(ss) {
			ss[i].Range.End = keyspace.At(ss[i+1].Range.Start)
		}
	}
	a, err := assignment.New(uint64(len(w.quanta)+1), ss)
	if err != nil {
		return "", err
	}
	w.a = a
	w.addNodes()
	w.publish(quantum.Quantum{Snapshot: a, Distributors: w.dists, Cause: "map"})
	return w.serving(), nil
}

// cmdWrite runs "write": writes go to the source.
func (w *world) cmdWrite(d *datadriven.TestData) (string, error) {
	for line := range strings.Lines(d.Input) {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "put":
			w.src.Put([]byte(f[1]), []byte(f[2]))
		case len(f) == 2 && f[0] == "delete":
			w.src.Delete([]byte(f[1]))
		case len(f) == 4 && f[0] == "putf":
			w.src.PutFragment([]byte(f[1]), f[2], []byte(f[3]))
		case len(f) == 3 && f[0] == "deletef":
			w.src.DeleteFragment([]byte(f[1]), f[2])
		default:
			return "", fmt.Errorf("bad write %q", line)
		}
	}
	clock, _ := w.src.Clock(context.Background())
	return fmt.Sprintf("clock %d\n", clock), nil
}

// cmdQuantum runs "quantum": the assigner publishes operations.
func (w *world) cmdQuantum(d *datadriven.TestData) (string, error) {
	var ops []assignment.Op
	for line := range strings.Lines(d.Input) {
		op, err := parseOp(line)
		if err != nil {
			return "", err
		}
		ops = append(ops, op)
	}
	next, err := w.a.Apply(ops)
	if err != nil {
		return "", err
	}
	w.a = next
	w.addNodes()
	clock, _ := w.src.Clock(context.Background())
	if c, ok := arg(d, "clock"); ok {
		v, err := strconv.ParseUint(c, 10, 64)
		if err != nil {
			return "", err
		}
		clock = v
	}
	w.publishAt(quantum.Quantum{Ops: ops, Cause: "quantum"}, clock)
	return fmt.Sprintf("quantum %d at clock %d\n", len(w.quanta), clock), nil
}

// cmdLeader runs "leader": a leader of a term takes over.
func (w *world) cmdLeader(d *datadriven.TestData) (string, error) {
	t, err := intArg(d, "term", 1)
	if err != nil {
		return "", err
	}
	w.term, w.seq = uint64(t), 0
	w.publish(quantum.Quantum{Snapshot: w.a, Distributors: w.dists, Cause: "reinit"})
	return fmt.Sprintf("quantum %d: %s\n", len(w.quanta), w.quanta[len(w.quanta)-1].Position), nil
}

// cmdPull runs "pull": a node pulls.
func (w *world) cmdPull(d *datadriven.TestData) (string, error) {
	name, _ := arg(d, "node")
	return w.pull(assignment.NodeID(name))
}

// cmdCheck runs "check": every node is checked.
func (w *world) cmdCheck(_ *datadriven.TestData) (string, error) {
	return w.check()
}

// cmdRestart runs "restart": a node's process restarts (its stream ends; its data and
// cursor stay).
func (w *world) cmdRestart(d *datadriven.TestData) (string, error) {
	name, _ := arg(d, "node")
	for _, ds := range w.ds {
		delete(ds.streams, assignment.NodeID(name))
	}
	return "ok\n", nil
}

// cmdWipe runs "wipe": a node restarts with an empty store.
func (w *world) cmdWipe(d *datadriven.TestData) (string, error) {
	name, _ := arg(d, "node")
	id := assignment.NodeID(name)
	for _, ds := range w.ds {
		delete(ds.streams, id)
	}
	w.nodes[id] = &modelNode{items: map[string]*modelItem{}}
	return "ok\n", nil
}

// cmdLimit runs "limit": a distributor's bounds change.
func (w *world) cmdLimit(d *datadriven.TestData) (string, error) {
	name, _ := arg(d, "d")
	ds := w.ds[name]
	if ds == nil {
		return "", fmt.Errorf("no distributor %q", name)
	}
	n, err := intArg(d, "bytes", ds.app.maxQueueBytes)
	if err != nil {
		return "", err
	}
	ahead, err := intArg(d, "ahead", ds.app.scanAhead)
	if err != nil {
		return "", err
	}
	ds.app.maxQueueBytes, ds.app.scanAhead = n, ahead
	return "ok\n", nil
}

// cmdShow runs "show": what a distributor holds.
func (w *world) cmdShow(d *datadriven.TestData) (string, error) {
	name, _ := arg(d, "d")
	ds := w.ds[name]
	if ds == nil {
		return "", fmt.Errorf("no distributor %q", name)
	}
	var b strings.Builder
	_, held := ds.seq.Held()
	fmt.Fprintf(&b, "clock %d, %d bytes of changes held\n", ds.router.Clock(), held)
	for _, id := range ds.router.Served() {
		ops, _ := ds.app.queues[id].depth()
		fmt.Fprintf(&b, "%s: holds %s, %d ops queued\n", id, ds.router.nodes[id].cover, ops)
	}
	return b.String(), nil
}

// scan runs a distributor's pending scans, whole or in pieces.
func (w *world) scan(d *datadriven.TestData) (string, error) {
	name, _ := arg(d, "d")
	ds := w.ds[name]
	if ds == nil {
		return "", fmt.Errorf("no distributor %q", name)
	}
	_, fail := arg(d, "fail")
	_, present := arg(d, "present")
	piece, err := intArg(d, "piece", 0)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	var left []ScanRequest
	for _, req := range ds.pending {
		at := req.Clock
		if present {
			at, _ = w.src.Clock(context.Background())
			fmt.Fprintf(&b, "scan %d for %s: %s asked at clock %d, read at %d: ", req.ID, req.Node, req.Range, req.Clock, at)
		} else {
			fmt.Fprintf(&b, "scan %d for %s: %s at clock %d: ", req.ID, req.Node, req.Range, req.Clock)
		}
		if piece > 0 && !fail {
			switch ready, stale := ds.app.scanReady(req); {
			case stale:
				b.WriteString("no longer awaited\n")
				delete(ds.read, req.ID)
				continue
			case !ready:
				b.WriteString("waits\n")
				left = append(left, req)
				continue
			}
		}
		items, ok := ds.read[req.ID]
		if !ok && !fail {
			found, err := w.src.Items(req.Range, at)
			if err != nil {
				return "", err
			}
			for _, it := range found {
				items = encodeItem(it, items)
			}
		}
		if fail {
			b.WriteString("0 ops\n") // the router hears of the failure
			ds.app.scanDone(req.ID, nil, 0, source.ErrCompacted)
		} else if piece > 0 && len(items) > piece {
			fmt.Fprintf(&b, "%d ops, %d to come\n", piece, len(items)-piece)
			ds.app.scanItems(req.ID, items[:piece])
			b.WriteString(ds.flush())
			ds.read[req.ID] = items[piece:]
			left = append(left, req)
			continue
		} else {
			fmt.Fprintf(&b, "%d ops\n", len(items))
			ds.app.scanDone(req.ID, items, at, nil)
		}
		b.WriteString(ds.flush())
		delete(ds.read, req.ID)
	}
	ds.pending = append(left, ds.app.takeScans()...)
	return b.String(), nil
}

func ids(s string) []assignment.NodeID {
	var out []assignment.NodeID
	for _, id := range strings.Split(s, ",") {
		out = append(out, assignment.NodeID(id))
	}
	return out
}

func parseOp(line string) (assignment.Op, error) {
	f := strings.Fields(line)
	point := func(i int) uint64 {
		p, _ := keyspace.ParsePoint(f[i])
		return p
	}
	switch {
	case len(f) == 3 && f[0] == "move":
		return assignment.Assign{Slice: point(1), Replicas: ids(f[2])}, nil
	case len(f) == 3 && f[0] == "split":
		return assignment.Split{Slice: point(1), At: point(2)}, nil
	case len(f) == 2 && f[0] == "merge":
		return assignment.Merge{Left: point(1)}, nil
	}
	return nil, fmt.Errorf("bad op %q", line)
}

func (w *world) addNodes() {
	for _, s := range w.a.All() {
		for _, id := range s.Replicas {
			if w.nodes[id] == nil {
				w.nodes[id] = &modelNode{items: map[string]*modelItem{}}
			}
		}
	}
}

func (w *world) publish(q quantum.Quantum) {
	clock, _ := w.src.Clock(context.Background())
	w.publishAt(q, clock)
}

func (w *world) publishAt(q quantum.Quantum, clock uint64) {
	w.seq++
	q.Position, q.Clock, q.Generation = quantum.Position{Term: w.term, Seq: w.seq}, clock, w.a.Generation()
	w.quanta = append(w.quanta, q)
}

// serving says which distributor serves each node.
func (w *world) serving() string {
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(w.nodes)) {
		d, _, ok := w.dists.For(id)
		if !ok {
			d = "none"
		}
		fmt.Fprintf(&b, "%s -> %s\n", id, d)
	}
	if b.Len() == 0 {
		return "ok\n"
	}
	return b.String()
}

func (w *world) deliver(d *datadriven.TestData) (string, error) {
	name, _ := arg(d, "d")
	ds := w.ds[name]
	if ds == nil {
		return "", fmt.Errorf("no distributor %q", name)
	}
	nq, err := intArg(d, "quanta", len(w.quanta)-ds.quanta)
	if err != nil {
		return "", err
	}
	_, naive := arg(d, "naive")
	_, progress := arg(d, "progress")
	var b strings.Builder
	apply := func(ev Event) { ds.apply(ev, &b) }
	for range nq {
		if ds.quanta == len(w.quanta) {
			return "", fmt.Errorf("%s heard of every quantum", name)
		}
		q := w.quanta[ds.quanta]
		ds.quanta++
		if ds.seq == nil {
			ds.seq, ds.clock = NewSequencer(q.Clock), q.Clock
		}
		if naive {
			apply(Event{Quantum: &q})
		} else {
			ds.seq.AddQuantum(q)
		}
	}
	if ds.seq == nil {
		return "", fmt.Errorf("%s heard of no quantum yet", name)
	}
	clock, _ := w.src.Clock(context.Background())
	nc, err := intArg(d, "changes", int(clock-ds.clock))
	if err != nil {
		return "", err
	}
	if nc > 0 {
		found, err := w.changes(ds.clock, ds.clock+uint64(nc))
		if err != nil {
			return "", err
		}
		for _, b := range found {
			if naive {
				apply(Event{Batch: &b})
			} else {
				ds.seq.AddBatch(b)
			}
		}
		ds.clock += uint64(nc)
	}
	if progress {
		ds.seq.AddBatch(source.Batch{Clock: ds.clock})
	}
	for {
		ev, ok := ds.seq.Next()
		if !ok {
			break
		}
		apply(ev)
	}
	return ds.summary(&b), nil
}

// apply steps an event into the distributor's router, and describes it and the actions.
func (ds *scriptDist) apply(ev Event, b *strings.Builder) {
	if ev.Quantum != nil {
		if err := ds.app.quantum(*ev.Quantum); err != nil {
			fmt.Fprintf(b, "quantum %s: error: %v\n", ev.Quantum.Position, err)
			return
		}
		fmt.Fprintf(b, "applied quantum %d (clock %d)\n", ev.Quantum.Seq, ev.Quantum.Clock)
		b.WriteString(ds.flush())
		return
	}
	ds.app.changes(*ev.Batch, time.Time{})
	fmt.Fprintf(b, "routed change %d\n", ev.Batch.Clock)
	b.WriteString(ds.flush())
}

// summary takes the scans the router asked for, and ends what deliver says with what the
// distributor holds.
func (ds *scriptDist) summary(b *strings.Builder) string {
	ds.pending = append(ds.pending, ds.app.takeScans()...)
	if wait, ok := ds.seq.Waiting(); ok {
		fmt.Fprintf(b, "a quantum waits for the source to reach clock %d\n", wait)
	}
	if qs, held := ds.seq.Held(); held > 0 {
		fmt.Fprintf(b, "%d quanta and %d bytes of changes held\n", qs, held)
	}
	if len(ds.pending) > 0 {
		fmt.Fprintf(b, "%d scans pending\n", len(ds.pending))
	}
	if b.Len() == 0 {
		return "ok\n"
	}
	return b.String()
}

// changes returns the source's changes with clocks in (from, to], one batch each.
func (w *world) changes(from, to uint64) ([]source.Batch, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out []source.Batch
	for b := range w.src.Watch(ctx, from) {
		if b.Err != nil {
			return nil, b.Err
		}
		out = append(out, b)
		if b.Clock >= to {
			break
		}
	}
	return out, nil
}

// modelNode is a node's data, kept by a script.
type modelNode struct {
	epoch, index, clock uint64
	gen                 uint64       // of the last delta with ops applied
	loading             keyspace.Set // added and not loaded yet
	cover               keyspace.Set
	list                []keyspace.Range
	items               map[string]*modelItem
}

type modelItem struct {
	value    []byte
	hasValue bool
	frags    map[string][]byte
}

// pull applies everything ready for node id at its distributor, through the wire encoding.
func (w *world) pull(id assignment.NodeID) (string, error) {
	n := w.nodes[id]
	if n == nil {
		return "", fmt.Errorf("no node %q", id)
	}
	name, _, ok := w.dists.For(id)
	if !ok {
		return "", fmt.Errorf("no distributor for %s", id)
	}
	ds := w.ds[name]
	att := ds.streams[id]
	var b strings.Builder
	if att == nil || att.Epoch != n.epoch {
		a, err := ds.app.attach(id, n.epoch, n.index)
		if err != nil {
			return "", err
		}
		att = &a
		ds.streams[id] = att
		ds.pending = append(ds.pending, ds.app.takeScans()...)
		fmt.Fprintf(&b, "attached to %s: epoch %d from %d (resumed %v)\n", name, a.Epoch, a.Index, a.Resumed)
		b.WriteString(ds.flush())
	}
	for {
		next := n.index
		if att.Epoch != n.epoch {
			next = att.Index // a snapshot, from 0
		}
		ops, clock, _, st := att.q.take(att.Stream, att.Epoch, next, 1000, 1<<20, ds.app.clock.Load())
		if st == takeRestart {
			delete(ds.streams, id)
			fmt.Fprintf(&b, "the queue restarted: a snapshot follows\n")
			out, err := w.pull(id)
			return b.String() + out, err
		}
		if st != takeOK {
			return "", fmt.Errorf("take: state %d", st)
		}
		if len(ops) == 0 {
			if clock != 0 {
				n.clock = clock
			}
			fmt.Fprintf(&b, "%s at epoch %d, index %d, clock %d, generation %d", id, n.epoch, n.index, n.clock, n.gen)
			if !n.loading.Empty() {
				fmt.Fprintf(&b, ", loading %s", n.loading)
			}
			b.WriteString("\n")
			return b.String(), nil
		}
		var resp pb.PullResponse
		if err := proto.Unmarshal(appendDelta(nil, att.Epoch, next, next+uint64(len(ops)), clock, deltaGen(ops, 0), ops, nil), &resp); err != nil {
			return "", err
		}
		desc, err := n.apply(resp.GetDelta())
		if err != nil {
			return "", err
		}
		b.WriteString(desc)
		att.q.ack(att.Epoch, n.index, time.Time{}, nil)
	}
}

// apply applies a delta to the model, as a client does, and describes its operations.
func (n *modelNode) apply(d *pb.Delta) (string, error) {
	switch {
	case d.GetEpoch() != n.epoch && (d.GetFrom() != 0 || d.GetOps()[0].GetReset_() == nil):
		return "", fmt.Errorf("delta of epoch %d does not start with a reset", d.GetEpoch())
	case d.GetEpoch() == n.epoch && d.GetFrom() != n.index:
		return "", fmt.Errorf("delta from %d, node at %d", d.GetFrom(), n.index)
	}
	var kinds []string
	for _, o := range d.GetOps() {
		if err := n.applyOp(o); err != nil {
			return "", err
		}
		kinds = append(kinds, describeDeltaOp(o))
	}
	n.epoch, n.index, n.clock = d.GetEpoch(), d.GetTo(), d.GetClock()
	if len(d.GetOps()) > 0 {
		n.gen = d.GetGeneration()
	}
	return fmt.Sprintf("delta %d..%d clock %d gen %d: %s\n", d.GetFrom(), d.GetTo(), d.GetClock(), d.GetGeneration(), strings.Join(kinds, ", ")), nil
}

// applyOp applies one operation of a delta to the model.
func (n *modelNode) applyOp(o *pb.DeltaOp) error {
	switch x := o.GetOp().(type) {
	case *pb.DeltaOp_Reset_:
		n.cover, n.list, n.items, n.loading = keyspace.Set{}, nil, map[string]*modelItem{}, keyspace.Set{}
	case *pb.DeltaOp_AddSlice:
		r, err := wire.RangeFromProto(x.AddSlice)
		if err != nil {
			return err
		}
		n.cover = n.cover.Union(keyspace.NewSet(r))
		n.loading = n.loading.Union(keyspace.NewSet(r))
	case *pb.DeltaOp_SliceLoaded:
		r, err := wire.RangeFromProto(x.SliceLoaded)
		if err != nil {
			return err
		}
		n.loading = n.loading.Minus(keyspace.NewSet(r))
	case *pb.DeltaOp_DropSlice:
		r, err := wire.RangeFromProto(x.DropSlice)
		if err != nil {
			return err
		}
		n.cover = n.cover.Minus(keyspace.NewSet(r))
		n.loading = n.loading.Minus(keyspace.NewSet(r))
		for k := range n.items {
			if r.Contains(keyspace.Hash([]byte(k))) {
				delete(n.items, k)
			}
		}
	case *pb.DeltaOp_SetSlices:
		n.list = nil
		for _, m := range x.SetSlices.GetRanges() {
			r, err := wire.RangeFromProto(m)
			if err != nil {
				return err
			}
			n.list = append(n.list, r)
		}
	case *pb.DeltaOp_Put:
		n.item(x.Put.GetKey()).value, n.item(x.Put.GetKey()).hasValue = x.Put.GetValue(), true
	case *pb.DeltaOp_Delete:
		delete(n.items, string(x.Delete.GetKey()))
	case *pb.DeltaOp_PutFragment:
		n.item(x.PutFragment.GetKey()).frags[x.PutFragment.GetFragment()] = x.PutFragment.GetValue()
	case *pb.DeltaOp_DeleteFragment:
		c := x.DeleteFragment
		if it := n.items[string(c.GetKey())]; it != nil {
			delete(it.frags, c.GetFragment())
			if !it.hasValue && len(it.frags) == 0 {
				delete(n.items, string(c.GetKey()))
			}
		}
	default:
		return fmt.Errorf("empty op")
	}
	return nil
}

// describeDeltaOp describes an operation of a delta.
func describeDeltaOp(o *pb.DeltaOp) string {
	switch x := o.GetOp().(type) {
	case *pb.DeltaOp_Reset_:
		return "reset"
	case *pb.DeltaOp_AddSlice:
		r, _ := wire.RangeFromProto(x.AddSlice)
		return "add " + r.String()
	case *pb.DeltaOp_DropSlice:
		r, _ := wire.RangeFromProto(x.DropSlice)
		return "drop " + r.String()
	case *pb.DeltaOp_SliceLoaded:
		r, _ := wire.RangeFromProto(x.SliceLoaded)
		return "loaded " + r.String()
	case *pb.DeltaOp_SetSlices:
		return fmt.Sprintf("slices(%d)", len(x.SetSlices.GetRanges()))
	case *pb.DeltaOp_Put:
		return fmt.Sprintf("put %s=%s", x.Put.GetKey(), x.Put.GetValue())
	case *pb.DeltaOp_Delete:
		return fmt.Sprintf("delete %s", x.Delete.GetKey())
	case *pb.DeltaOp_PutFragment:
		c := x.PutFragment
		return fmt.Sprintf("putf %s/%s=%s", c.GetKey(), c.GetFragment(), c.GetValue())
	case *pb.DeltaOp_DeleteFragment:
		c := x.DeleteFragment
		return fmt.Sprintf("deletef %s/%s", c.GetKey(), c.GetFragment())
	}
	return "empty"
}

func (n *modelNode) item(key []byte) *modelItem {
	it := n.items[string(key)]
	if it == nil {
		it = &modelItem{frags: map[string][]byte{}}
		n.items[string(key)] = it
	}
	return it
}

// check compares every node with what it must hold under the assigner's map and the source
// as of now.
func (w *world) check() (string, error) {
	clock, _ := w.src.Clock(context.Background())
	all, err := w.src.Items(keyspace.Full(), clock)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(w.nodes)) {
		n := w.nodes[id]
		var want []keyspace.Range
		for _, s := range w.a.All() {
			if s.Holds(id) {
				want = append(want, s.Range)
			}
		}
		if !n.cover.Equal(keyspace.NewSet(want...)) {
			fmt.Fprintf(&b, "%s holds %s, must hold %s\n", id, n.cover, keyspace.NewSet(want...))
		}
		if !slices.Equal(n.list, want) {
			fmt.Fprintf(&b, "%s lists %d slices, holds %d\n", id, len(n.list), len(want))
		}
		must := map[string]bool{}
		for _, it := range all {
			if _, s := w.a.Lookup(it.Hash); !s.Holds(id) {
				continue
			}
			must[string(it.Key)] = true
			got := n.items[string(it.Key)]
			switch {
			case got == nil:
				fmt.Fprintf(&b, "%s: missing %s\n", id, it.Key)
			case got.hasValue != it.Exists || !bytes.Equal(got.value, it.Value) || len(got.frags) != len(it.Fragments):
				fmt.Fprintf(&b, "%s: stale %s\n", id, it.Key)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(n.items)) {
			if !must[k] {
				fmt.Fprintf(&b, "%s: leaked %s\n", id, k)
			}
		}
	}
	if b.Len() == 0 {
		return fmt.Sprintf("ok: %d items\n", len(all)), nil
	}
	return b.String(), nil
}
