package core

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// TestScripts runs the core's scripts in testdata/: events stepped through Core.Step on a
// clock the script moves, with an in-memory store that holds what was committed, so that a
// script can fail writes, lose leadership and lead again from what is stored. Regenerate
// expectations with
//
//	go test ./internal/assigner -run TestScripts -rewrite
//
// and review the diff. The core starts with NodeTTL 10s, PassInterval 1s, ClockInterval
// 20ms and small slice counts (min 1, initial 2, max 8 per node). Commands (every argument
// must be used, or the test fails):
//
//	leader term=T [clock=C]   leadership gained from the stored state, at source clock C
//	lose                      leadership lost
//	tick [+D]                 D passes (default: until the core's wake), then a Tick
//	stall +D                  D passes with the driver away, then LoopStalled
//	clock c=C                 the source reached C
//	source-lost err=E [misconfigured]   the source's clock cannot be followed, for E
//	distributors [IDS...]     the live distributors, each at "ID:7001"
//	register id=N [cap=C] [addr=A] [roles=R] [inc=I]   roles: the model a member expects and
//	                          acts on; inc: the incarnation of the process that registers
//	config [make-before-break] [handoff-timeout=D] [load-warm-up=D] [first-map-nodes=N] [first-map-wait=D] [roles=R] [exclusive]
//	       [quarantine-window=D] [quarantine-probe=D] [min-replicas=N]
//	                          a new core so configured (first command)
//	heartbeat id=N [gen=G] [loading=I,J] [primaries=K] [tokens=T]   the node applied
//	                          generation G, still loads slices I, J and holds slice K as
//	                          primary (indices in the map) with token T (default: the map's)
//	report id=N [window=D]    input: "I LOAD [KEYS]" lines, I the slice's index in the map
//	deregister id=N [grace=D]   with grace: the node restarts within D, keeping its slices
//	move slice=I to=A,B       split slice=I [at=HASH]      merge left=I (with the next)
//	pin slice=I               unpin slice=I
//	drain id=N [cancel]       freeze [reason=R]            unfreeze
//	algorithm name=A [k=v...]
//	reconfigure [name=A] [node-ttl=D] [min-replicas=N] [roles=R] [exclusive] [k=v...]
//	                          Reconfigure: the core's config with these settings over it
//	status | nodes | slices | explain    the read queries
//	commit | fail [err=E]     the outcome of the write in flight
//	show                      the core's state: position, meta, map, nodes, and the probes
//	                          of quarantines under way (narrow.go)
//
// Stepping commands take [who=W] (the caller) and [hold]: without hold, every write the
// step asks for is committed at once, each commit printed as "> commit".
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := newScript(t)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := h.run(d)
			if err != nil {
				out += "error: " + err.Error() + "\n"
			}
			if unread := d.CmdArgs; len(unread) > 0 {
				t.Fatalf("%s: unused arguments %v", d.Pos, unread)
			}
			return out
		})
	})
}

// script is the state of one script: the core, the time, and the store.
type script struct {
	c    *Core
	now  time.Time
	wake time.Time
	mem  memStore
}

// memStore keeps what the core's committed writes stored.
type memStore struct {
	found   bool
	meta    Meta
	a       *assignment.Assignment
	nodes   map[assignment.NodeID]Node
	history []balance.Move
}

func (m *memStore) apply(w *Write) error {
	if w.PutNode != nil {
		m.nodes[w.PutNode.ID] = *w.PutNode
	}
	for _, id := range w.DeleteNodes {
		delete(m.nodes, id)
	}
	switch {
	case w.Init:
		m.a = w.Map
	case w.Entry != nil:
		next, err := m.a.Apply(w.Entry.Ops)
		if err != nil {
			return err
		}
		m.a, m.history = next.WithGeneration(w.Entry.Generation), append(m.history, w.Entry.Moves...)
	case !w.SaveMeta:
		return nil
	}
	m.meta, m.found = w.Meta, true
	return nil
}

func (m *memStore) state() State {
	st := State{Meta: m.meta, Assignment: m.a, History: slices.Clone(m.history)}
	for _, id := range slices.Sorted(maps.Keys(m.nodes)) {
		st.Nodes = append(st.Nodes, m.nodes[id])
	}
	return st
}

func newScript(t *testing.T) *script {
	c, err := New(scriptConfig())
	if err != nil {
		t.Fatal(err)
	}
	return &script{c: c, now: t0, mem: memStore{nodes: map[assignment.NodeID]Node{}}}
}

func scriptConfig() Config {
	return Config{NodeTTL: 10 * time.Second, PassInterval: time.Second, ClockInterval: 20 * time.Millisecond,
		Algorithm: "weighted-move", Params: smallParams, BreakBeforeMake: true} // a script opts in with config make-before-break
}

// configure replaces the core by one with the command's settings.
func (h *script) configure(d *datadriven.TestData) (string, error) {
	cfg := scriptConfig()
	cfg.BreakBeforeMake = !flag(d, "make-before-break")
	timeout, err := time.ParseDuration(take(d, "handoff-timeout", "0s"))
	if err != nil {
		return "", err
	}
	cfg.HandoffTimeout = timeout
	if cfg.LoadWarmUp, err = time.ParseDuration(take(d, "load-warm-up", "0s")); err != nil {
		return "", err
	}
	if cfg.FirstMapNodes, err = strconv.Atoi(take(d, "first-map-nodes", "0")); err != nil {
		return "", err
	}
	if cfg.FirstMapWait, err = time.ParseDuration(take(d, "first-map-wait", "0s")); err != nil {
		return "", err
	}
	cfg.Roles = take(d, "roles", "")
	cfg.Exclusive = flag(d, "exclusive")
	if cfg.QuarantineWindow, err = time.ParseDuration(take(d, "quarantine-window", "0s")); err != nil {
		return "", err
	}
	if cfg.QuarantineProbe, err = time.ParseDuration(take(d, "quarantine-probe", "0s")); err != nil {
		return "", err
	}
	if cfg.MinReplicas, err = strconv.Atoi(take(d, "min-replicas", "0")); err != nil {
		return "", err
	}
	if h.c, err = New(cfg); err != nil {
		return "", err
	}
	out := fmt.Sprintf("make-before-break %t handoff-timeout %s", !h.c.Config().BreakBeforeMake, h.c.Config().HandoffTimeout)
	if w := h.c.Config().LoadWarmUp; w > 0 {
		out += fmt.Sprintf(" load-warm-up %s", w)
	}
	if n := h.c.Config().FirstMapNodes; n > 0 {
		out += fmt.Sprintf(" first-map-nodes %d first-map-wait %s", n, h.c.Config().FirstMapWait)
	}
	if r := h.c.Config().Roles; r != RolesReplicas {
		out += " roles " + r
	}
	if h.c.Config().Exclusive {
		out += " exclusive"
	}
	if w := h.c.Config().QuarantineWindow; w != defaultQuarantineTTLs*h.c.Config().NodeTTL {
		out += fmt.Sprintf(" quarantine-window %s", w)
	}
	if p := h.c.Config().QuarantineProbe; p != h.c.Config().QuarantineWindow {
		out += fmt.Sprintf(" quarantine-probe %s", p)
	}
	if n := h.c.Config().MinReplicas; n > 1 {
		out += fmt.Sprintf(" min-replicas %d", n)
	}
	return out + "\n", nil
}

// reconfigure builds the Reconfigure event of the command: the script's config with the
// command's settings over it.
func (h *script) reconfigure(d *datadriven.TestData) (Event, error) {
	cfg := h.c.Config()
	cfg.Roles = take(d, "roles", cfg.Roles)
	cfg.Exclusive = cfg.Exclusive || flag(d, "exclusive")
	var err error
	if cfg.NodeTTL, err = time.ParseDuration(take(d, "node-ttl", cfg.NodeTTL.String())); err != nil {
		return nil, err
	}
	if cfg.MinReplicas, err = strconv.Atoi(take(d, "min-replicas", strconv.Itoa(cfg.MinReplicas))); err != nil {
		return nil, err
	}
	cfg.Algorithm = take(d, "name", cfg.Algorithm)
	cfg.Params = maps.Clone(cfg.Params)
	for _, a := range d.CmdArgs {
		cfg.Params[a.Key] = strings.Join(a.Vals, ",")
	}
	d.CmdArgs = nil
	return Reconfigure{Config: cfg}, nil
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

// flag removes argument key and reports whether it was there.
func flag(d *datadriven.TestData, key string) bool {
	for i, a := range d.CmdArgs {
		if a.Key == key {
			d.CmdArgs = slices.Delete(d.CmdArgs, i, i+1)
			return true
		}
	}
	return false
}

// offset takes the first argument if it is a duration "+D".
func offset(d *datadriven.TestData) (time.Duration, bool, error) {
	if len(d.CmdArgs) == 0 || !strings.HasPrefix(d.CmdArgs[0].Key, "+") {
		return 0, false, nil
	}
	v, err := time.ParseDuration(d.CmdArgs[0].Key[1:])
	d.CmdArgs = d.CmdArgs[1:]
	return v, true, err
}

func (h *script) run(d *datadriven.TestData) (string, error) {
	switch d.Cmd {
	case "show":
		return h.show(), nil
	case "config":
		return h.configure(d)
	case "commit":
		return h.step(d, WriteCommitted{})
	case "fail":
		return h.step(d, WriteFailed{Err: errors.New(take(d, "err", "etcd: request timed out"))})
	case "tick", "stall":
		dur, given, err := offset(d)
		if err != nil {
			return "", err
		}
		switch {
		case given:
			h.now = h.now.Add(dur)
		case d.Cmd == "tick" && h.wake.After(h.now):
			h.now = h.wake
		}
		if d.Cmd == "stall" {
			return h.step(d, LoopStalled{Gap: dur})
		}
		return h.step(d, Tick{})
	}
	ev, err := h.event(d)
	if err != nil {
		return "", err
	}
	return h.step(d, ev)
}

// event builds the event of a command.
func (h *script) event(d *datadriven.TestData) (Event, error) {
	by := Caller{Who: take(d, "who", "")}
	id := assignment.NodeID(take(d, "id", ""))
	switch d.Cmd {
	case "leader":
		term, err := strconv.ParseUint(take(d, "term", "1"), 10, 64)
		if err != nil {
			return nil, err
		}
		clock, err := strconv.ParseUint(take(d, "clock", "0"), 10, 64)
		return LeadershipGained{Term: term, State: h.mem.state(), Found: h.mem.found, Clock: clock}, err
	case "lose":
		return LeadershipLost{}, nil
	case "clock":
		clock, err := strconv.ParseUint(take(d, "c", "0"), 10, 64)
		return ClockObserved{Clock: clock}, err
	case "source-lost":
		mis := flag(d, "misconfigured")
		return SourceLost{Err: take(d, "err", ""), Misconfigured: mis}, nil
	case "distributors":
		ds := quantum.Distributors{}
		for _, a := range d.CmdArgs {
			ds[a.Key] = a.Key + ":7001"
		}
		d.CmdArgs = nil
		return DistributorsChanged{Distributors: ds}, nil
	case "register":
		capacity, err := strconv.ParseFloat(take(d, "cap", "0"), 64)
		return Register{Caller: by, Node: Node{Node: assignment.Node{ID: id, Capacity: capacity},
			Address: take(d, "addr", string(id)+":1"), Roles: take(d, "roles", ""), Incarnation: take(d, "inc", "")}}, err
	case "heartbeat":
		return h.heartbeat(d, by, id)
	case "report":
		return h.report(d, by, id)
	case "deregister":
		grace, err := time.ParseDuration(take(d, "grace", "0s"))
		if err != nil {
			return nil, err
		}
		return Deregister{Caller: by, Node: id, Grace: grace}, nil
	case "drain":
		return Drain{Caller: by, Node: id, Cancel: flag(d, "cancel")}, nil
	case "freeze":
		return Freeze{Caller: by, Reason: take(d, "reason", "")}, nil
	case "unfreeze":
		return Unfreeze{Caller: by}, nil
	case "reconfigure":
		return h.reconfigure(d)
	case "algorithm":
		name := take(d, "name", "")
		params := map[string]string{}
		for _, a := range d.CmdArgs {
			params[a.Key] = strings.Join(a.Vals, ",")
		}
		d.CmdArgs = nil
		return SetAlgorithm{Caller: by, Name: name, Params: params}, nil
	case "status":
		return GetStatus{Caller: by}, nil
	case "nodes":
		return ListNodes{Caller: by}, nil
	case "slices":
		return ListSlices{Caller: by, Limit: 1000}, nil
	case "explain":
		return GetExplain{Caller: by}, nil
	}
	return h.sliceEvent(d, by)
}

// sliceEvent builds the event of a command that names slices by their index in the map.
func (h *script) sliceEvent(d *datadriven.TestData, by Caller) (Event, error) {
	ref := func(key string) (SliceRef, error) {
		i, err := strconv.Atoi(take(d, key, "0"))
		a, _, _ := h.c.Assignment()
		if err != nil || a == nil || i < 0 || i >= a.Len() {
			return SliceRef{}, fmt.Errorf("no slice %d (%v)", i, err)
		}
		start := a.Slice(i).Range.Start
		return SliceRef{Start: &start}, nil
	}
	key := "slice"
	if d.Cmd == "merge" {
		key = "left"
	}
	s, err := ref(key)
	if err != nil {
		return nil, err
	}
	switch d.Cmd {
	case "move":
		var to []assignment.NodeID
		for id := range strings.SplitSeq(take(d, "to", ""), ",") {
			to = append(to, assignment.NodeID(id))
		}
		return Move{Caller: by, Slice: s, To: to}, nil
	case "split":
		var at *uint64
		if v := take(d, "at", ""); v != "" {
			p, err := strconv.ParseUint(v, 0, 64)
			if err != nil {
				return nil, err
			}
			at = &p
		}
		return Split{Caller: by, Slice: s, At: at}, nil
	case "merge":
		next := uint64(0)
		a, _, _ := h.c.Assignment()
		i, _ := a.Find(*s.Start)
		if i+1 < a.Len() {
			next = a.Slice(i + 1).Range.Start
		}
		return Merge{Caller: by, Left: s, Right: SliceRef{Start: &next}}, nil
	case "pin":
		return Pin{Caller: by, Slice: s}, nil
	case "unpin":
		return Unpin{Caller: by, Slice: s}, nil
	case "unquarantine":
		return Unquarantine{Caller: by, Slice: s}, nil
	}
	return nil, fmt.Errorf("unknown command %q", d.Cmd)
}

// heartbeat builds a heartbeat with the generation and the loading slices given.
func (h *script) heartbeat(d *datadriven.TestData, by Caller, id assignment.NodeID) (Event, error) {
	gen, err := strconv.ParseUint(take(d, "gen", "0"), 10, 64)
	if err != nil {
		return nil, err
	}
	hb := Heartbeat{Caller: by, Node: id, Generation: gen}
	if hb.Loading, err = h.sliceRanges(take(d, "loading", "")); err != nil {
		return nil, err
	}
	if hb.Primaries, err = h.sliceRanges(take(d, "primaries", "")); err != nil {
		return nil, err
	}
	a, _, _ := h.c.Assignment()
	for _, r := range hb.Primaries {
		_, s := a.Lookup(r.Start)
		hb.Tokens = append(hb.Tokens, s.Token)
	}
	if v := take(d, "tokens", ""); v != "" {
		hb.Tokens = nil
		for f := range strings.SplitSeq(v, ",") {
			t, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("bad token %q", f)
			}
			hb.Tokens = append(hb.Tokens, t)
		}
	}
	if flag(d, "load") { // the samples follow, as for report; of=N says the report is N's
		r, err := h.loadReport(d, assignment.NodeID(take(d, "of", string(id))))
		if err != nil {
			return nil, err
		}
		hb.Report = &r
	}
	return hb, nil
}

// sliceRanges returns the ranges of the map's slices listed by index, "I,J".
func (h *script) sliceRanges(v string) ([]keyspace.Range, error) {
	if v == "" {
		return nil, nil
	}
	a, _, _ := h.c.Assignment()
	var out []keyspace.Range
	for f := range strings.SplitSeq(v, ",") {
		i, err := strconv.Atoi(f)
		if err != nil || a == nil || i < 0 || i >= a.Len() {
			return nil, fmt.Errorf("bad slice %q", f)
		}
		out = append(out, a.Slice(i).Range)
	}
	return out, nil
}

// report builds a load report from "I LOAD [KEYS]" lines.
func (h *script) report(d *datadriven.TestData, by Caller, id assignment.NodeID) (Event, error) {
	r, err := h.loadReport(d, id)
	if err != nil {
		return nil, err
	}
	return ReportLoad{Caller: by, Report: r}, nil
}

// loadReport reads node id's report: window=D, and a sample a line, "SLICE LOAD [KEYS]".
func (h *script) loadReport(d *datadriven.TestData, id assignment.NodeID) (load.Report, error) {
	window, err := time.ParseDuration(take(d, "window", "1s"))
	if err != nil {
		return load.Report{}, err
	}
	r := load.Report{Node: id, Window: window}
	a, _, _ := h.c.Assignment()
	for line := range strings.Lines(d.Input) {
		f := strings.Fields(line)
		if len(f) < 2 || a == nil {
			return r, fmt.Errorf("bad sample %q", line)
		}
		i, err := strconv.Atoi(f[0])
		if err != nil || i < 0 || i >= a.Len() {
			return r, fmt.Errorf("bad slice in %q", line)
		}
		s := load.Sample{Range: a.Slice(i).Range}
		if s.Load, err = strconv.ParseFloat(f[1], 64); err != nil {
			return r, err
		}
		if len(f) > 2 {
			if s.Keys, err = strconv.ParseFloat(f[2], 64); err != nil {
				return r, err
			}
		}
		r.Samples = append(r.Samples, s)
	}
	return r, nil
}

// step steps ev and prints every output; without hold, it commits each write at once.
func (h *script) step(d *datadriven.TestData, ev Event) (string, error) {
	hold := flag(d, "hold")
	var b strings.Builder
	switch ev.(type) {
	case WriteCommitted:
		if err := h.mem.apply(h.pendingWrite()); err != nil {
			return "", err
		}
	case WriteFailed:
		h.pendingWrite()
	}
	out := h.c.Step(h.now, ev)
	for {
		h.print(&b, out)
		h.wake = out.Wake
		if out.Write == nil || hold {
			break
		}
		if err := h.mem.apply(h.pendingWrite()); err != nil {
			return b.String(), err
		}
		b.WriteString("> commit\n")
		out = h.c.Step(h.now, WriteCommitted{})
	}
	if !h.wake.IsZero() {
		fmt.Fprintf(&b, "wake %s\n", h.at(h.wake))
	}
	return b.String(), nil
}

// pendingWrite returns the write in flight, as the core holds it, and forgets it.
func (h *script) pendingWrite() *Write {
	if h.c.inflight == nil {
		return &Write{}
	}
	return &h.c.inflight.write
}

// at prints a time as its offset from the start of the script.
func (h *script) at(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return "+" + t.Sub(t0).String()
}

func (h *script) print(b *strings.Builder, out Output) {
	if w := out.Write; w != nil {
		printWrite(b, w)
	}
	for _, p := range out.Publish {
		q := p.Quantum
		fmt.Fprintf(b, "publish %s clock %d gen %d cause %q", q.Position, q.Clock, q.Generation, q.Cause)
		if q.By != "" {
			fmt.Fprintf(b, " by %q", q.By)
		}
		b.WriteString("\n")
		if q.Snapshot != nil {
			fmt.Fprintf(b, "  reinit: %d slices, distributors %v\n", q.Snapshot.Len(), slices.Sorted(maps.Keys(q.Distributors)))
		}
		for _, op := range q.Ops {
			fmt.Fprintf(b, "  %s\n", op)
		}
	}
	if s := out.Snapshot; s != nil {
		fmt.Fprintf(b, "snapshot as of entry %d\n", s.Index)
	}
	for _, r := range out.Log {
		fmt.Fprintf(b, "log %s: %s%s\n", strings.ToLower(r.Level.String()), r.Msg, attrs(r.Attrs))
	}
	if p := out.Pass; p != nil {
		fmt.Fprintf(b, "pass done: %s\n", p.Summary)
	}
	if out.PassFailed {
		b.WriteString("pass failed\n")
	}
	if ho := out.Handoffs; ho.Started+ho.Completed+ho.RolledBack > 0 {
		fmt.Fprintf(b, "handoffs: started %d completed %d rolled back %d durations %v\n", ho.Started, ho.Completed, ho.RolledBack, ho.Durations)
	}
	if ho := out.Handoffs; ho.Promoted+ho.Forced > 0 {
		fmt.Fprintf(b, "primaries: promoted %d after a demotion, %d without\n", ho.Promoted, ho.Forced)
	}
	if r := out.Reply; r != nil {
		h.printReply(b, r)
	}
}

func attrs(kv []any) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		switch v := kv[i+1].(type) {
		case string:
			fmt.Fprintf(&b, " %v=%q", kv[i], v)
		case error:
			fmt.Fprintf(&b, " %v=%q", kv[i], v.Error())
		default:
			fmt.Fprintf(&b, " %v=%v", kv[i], v)
		}
	}
	return b.String()
}

func printWrite(b *strings.Builder, w *Write) {
	b.WriteString("write:\n")
	if n := w.PutNode; n != nil {
		fmt.Fprintf(b, "  put node %s at %q capacity %g\n", n.ID, n.Address, n.Capacity)
	}
	if len(w.DeleteNodes) > 0 {
		fmt.Fprintf(b, "  delete nodes %v\n", w.DeleteNodes)
	}
	switch {
	case w.Init:
		fmt.Fprintf(b, "  init: %d slices, gen %d\n", w.Map.Len(), w.Map.Generation())
	case w.Entry != nil:
		e := w.Entry
		fmt.Fprintf(b, "  entry %d: %d.%d cause %q by %q, %d ops, %d moves\n", e.Index, e.Term, e.Seq, e.Cause, e.By, len(e.Ops), len(e.Moves))
	}
	if w.Init || w.Entry != nil || w.SaveMeta {
		fmt.Fprintf(b, "  meta: %s\n", formatMeta(w.Meta))
	}
}

func formatMeta(m Meta) string {
	s := fmt.Sprintf("term %d seq %d clock %d gen %d index %d pass %d %s", m.Term, m.Seq, m.Clock, m.Generation,
		m.LastIndex, m.Pass, m.Algorithm)
	if !maps.Equal(m.Params, smallParams) {
		s += fmt.Sprintf(" %v", m.Params)
	}
	if want := configured(scriptConfig()); m.Configured != want {
		s += fmt.Sprintf(" configured %q", m.Configured)
	}
	if m.Frozen {
		s += fmt.Sprintf(" frozen %q", m.FreezeReason)
	}
	if len(m.Pins) > 0 {
		s += fmt.Sprintf(" pins %v", m.Pins)
	}
	if len(m.Draining) > 0 {
		s += fmt.Sprintf(" draining %v", m.Draining)
	}
	for _, q := range m.Quarantined {
		s += fmt.Sprintf(" quarantined %s by %s at +%s", q.Range, assignment.FormatReplicas(q.Nodes), q.Since.Sub(t0))
	}
	return s
}

func (h *script) printReply(b *strings.Builder, r *Reply) {
	if r.Err != nil {
		fmt.Fprintf(b, "reply: error: %v\n", r.Err)
		return
	}
	b.WriteString("reply: ok")
	if r.TTL > 0 {
		fmt.Fprintf(b, " ttl %s", r.TTL)
	}
	if r.Lease > 0 {
		fmt.Fprintf(b, " lease %s", r.Lease)
	}
	if r.Draining {
		b.WriteString(" draining")
	}
	if r.Distributor != nil {
		fmt.Fprintf(b, " distributor %s", r.Distributor.ID)
	}
	if c := r.Change; c != nil {
		fmt.Fprintf(b, " %q at %s gen %d", c.Summary, c.Position, c.Generation)
		if !c.Persisted {
			b.WriteString(" (nothing stored)")
		}
	}
	if r.Range != (keyspace.Range{}) {
		fmt.Fprintf(b, " range %s", r.Range)
	}
	if r.Held > 0 {
		fmt.Fprintf(b, " held %d", r.Held)
	}
	b.WriteString("\n")
	h.printQuery(b, r)
}

func (h *script) printQuery(b *strings.Builder, r *Reply) {
	if st := r.Status; st != nil {
		fmt.Fprintf(b, "  at %s clock %d gen %d imbalance %.3f slices %d nodes %d frozen %t algorithm %s last pass %s failures %d\n",
			st.Position, st.Clock, st.Generation, st.Imbalance, st.Slices, st.Nodes, st.Frozen, st.Algorithm, h.at(st.LastPass), st.PassFailures)
		if st.Handoffs > 0 {
			fmt.Fprintf(b, "  handoffs %d\n", st.Handoffs)
		}
		if st.SourceError != "" {
			fmt.Fprintf(b, "  source lost at %s misconfigured %t: %s\n", h.at(st.SourceLostSince), st.SourceMisconfigured, st.SourceError)
		}
		h.printQuarantined(b, st.Quarantined)
	}
	for _, n := range r.Nodes {
		fmt.Fprintf(b, "  %s slices %d load %.3f seen %s draining %t\n", n.ID, n.Slices, n.Load, h.at(n.LastSeen), n.Draining)
	}
	for _, s := range r.Slices {
		fmt.Fprintf(b, "  %s load %.3f keys %.0f pinned %t\n", s.Slice, s.Load, s.Keys, s.Pinned)
	}
	if x := r.Explain; x != nil {
		fmt.Fprintf(b, "  passed %t at %s failures %d", x.Passed, x.Position, x.Failures)
		if x.Error != "" {
			fmt.Fprintf(b, " error %q at %s", x.Error, h.at(x.ErrorTime))
		}
		if x.Passed {
			fmt.Fprintf(b, " imbalance %.3f -> %.3f moves %d stop %q", x.ImbalanceBefore, x.ImbalanceAfter, x.Moves, x.Stop)
		}
		b.WriteString("\n")
		h.printQuarantined(b, x.Quarantined)
	}
}

func (h *script) printQuarantined(b *strings.Builder, qs []Quarantine) {
	for _, q := range qs {
		fmt.Fprintf(b, "  quarantined %s since %s by %s\n", q.Range, h.at(q.Since), assignment.FormatReplicas(q.Nodes))
	}
}

func (h *script) show() string {
	c := h.c
	var b strings.Builder
	term, leading := c.Leading()
	a, pos, published := c.Assignment()
	fmt.Fprintf(&b, "time %s term %d leading %t at %s clock %d published %d\n", h.at(h.now), term, leading, pos, c.clock, published)
	fmt.Fprintf(&b, "meta: %s\n", formatMeta(c.Meta()))
	if c.failed.count > 0 || c.failed.err != "" {
		fmt.Fprintf(&b, "pass failures: %d, last %q at %s\n", c.failed.count, c.failed.err, h.at(c.failed.at))
	}
	if a == nil {
		b.WriteString("map: none\n")
	} else {
		fmt.Fprintf(&b, "map gen %d:\n", a.Generation())
		for i, s := range a.All() {
			fmt.Fprintf(&b, "  %d %s\n", i, s)
		}
	}
	b.WriteString("nodes:\n")
	for _, n := range c.Nodes() {
		fmt.Fprintf(&b, "  %s seen %s", n.ID, h.at(n.LastSeen))
		if n.Draining {
			b.WriteString(" draining")
		}
		b.WriteString("\n")
	}
	for _, p := range c.qw.probes {
		fmt.Fprintf(&b, "probe %s on %s at gen %d since %s", describe(p.part), p.canary, p.gen, h.at(p.started))
		if !p.loaded.IsZero() {
			fmt.Fprintf(&b, " loaded %s", h.at(p.loaded))
		}
		if p.served {
			b.WriteString(" served")
		}
		b.WriteString("\n")
	}
	return b.String()
}
