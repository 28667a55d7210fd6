package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// ErrTrace is wrapped by every error about a trace; the message names the line.
var ErrTrace = errors.New("sim: bad trace")

// MaxEpoch is the latest epoch a trace may name: a run counts its epochs up to the last
// event's, and no run goes that far.
const MaxEpoch = math.MaxInt32

// Event is one line of a trace: exactly one of setting a key's load, deleting a key, adding a
// node or removing one, from Epoch on.
type Event struct {
	Epoch int
	Line  int
	Kind  EventKind
	// Name is the key or the node the event is about.
	Name string
	// Value is the key's load (SetLoad) or the node's capacity (AddNode).
	Value float64
	// Labels are the node's labels (AddNode), which it registers with on the core.
	Labels map[string]string
}

// EventKind says what an Event does.
type EventKind uint8

// The kinds of Event.
const (
	SetLoad EventKind = iota + 1
	DeleteKey
	AddNode
	RemoveNode
)

type traceLine struct {
	Epoch      *int              `json:"epoch"`
	Key        *string           `json:"key"`
	Load       *float64          `json:"load"`
	DeleteKey  *string           `json:"delete_key"`
	AddNode    *string           `json:"add_node"`
	Capacity   *float64          `json:"capacity"`
	Labels     map[string]string `json:"labels"`
	RemoveNode *string           `json:"remove_node"`
}

// Trace is a parsed, checked trace.
type Trace struct {
	Events []Event
	// LastEpoch is the epoch of the last event, -1 for an empty trace.
	LastEpoch int
	// NodesAtStart reports whether the trace adds nodes at epoch 0, in which case they are the
	// initial nodes instead of --nodes.
	NodesAtStart bool
}

// ReadTrace parses a JSON Lines trace, sorted by epoch, one event per line:
//
//	{"epoch":E,"key":"k","load":L}               from epoch E on, key k has load L
//	{"epoch":E,"delete_key":"k"}                 key k is deleted
//	{"epoch":E,"add_node":"n1","capacity":1.0}   node n1 joins (capacity optional, default 1;
//	                                             "labels":{"zone":"a"} optional, registered
//	                                             with the core)
//	{"epoch":E,"remove_node":"n1"}               node n1 leaves
//
// Blank lines are skipped. It checks everything it can before the simulation starts: a line
// that is not valid JSON, has unknown fields, names no action or several, has a negative or
// non-finite number or an epoch beyond MaxEpoch, goes back in epoch, deletes a key that does
// not exist, or adds a node twice or removes one that is not there is rejected with its line
// number and the reason.
// initialNodes are the nodes that exist from the start when the trace adds none at epoch 0.
func ReadTrace(r io.Reader, initialNodes []assignment.NodeID) (*Trace, error) {
	t := &Trace{LastEpoch: -1}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		ev, err := parseLine(b)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		if ev.Epoch < t.LastEpoch {
			return nil, fmt.Errorf("%w: line %d: epoch %d comes after epoch %d; the trace must be sorted by epoch",
				ErrTrace, line, ev.Epoch, t.LastEpoch)
		}
		ev.Line, t.LastEpoch = line, ev.Epoch
		t.Events = append(t.Events, ev)
		if ev.Kind == AddNode && ev.Epoch == 0 {
			t.NodesAtStart = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: reading: %w", ErrTrace, err)
	}
	return t, t.check(initialNodes)
}

func parseLine(b []byte) (Event, error) {
	var tl traceLine
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tl); err != nil {
		return Event{}, fmt.Errorf("not a JSON event: %w", err)
	}
	if dec.More() {
		return Event{}, errors.New("more than one JSON value on the line")
	}
	if tl.Epoch == nil {
		return Event{}, errors.New(`missing "epoch"`)
	}
	if *tl.Epoch < 0 || *tl.Epoch > MaxEpoch {
		return Event{}, fmt.Errorf("epoch %d is out of range; want 0 to %d", *tl.Epoch, MaxEpoch)
	}
	ev := Event{Epoch: *tl.Epoch}
	var kinds []string
	if tl.Key != nil {
		kinds = append(kinds, `"key"`)
		if tl.Load == nil {
			return Event{}, fmt.Errorf(`key %q has no "load"`, *tl.Key)
		}
		ev.Kind, ev.Name, ev.Value = SetLoad, *tl.Key, *tl.Load
	}
	if tl.DeleteKey != nil {
		kinds = append(kinds, `"delete_key"`)
		ev.Kind, ev.Name = DeleteKey, *tl.DeleteKey
	}
	if tl.AddNode != nil {
		kinds = append(kinds, `"add_node"`)
		ev.Kind, ev.Name, ev.Value, ev.Labels = AddNode, *tl.AddNode, 1, tl.Labels
		if tl.Capacity != nil {
			ev.Value = *tl.Capacity
		}
	}
	if tl.RemoveNode != nil {
		kinds = append(kinds, `"remove_node"`)
		ev.Kind, ev.Name = RemoveNode, *tl.RemoveNode
	}
	switch {
	case len(kinds) == 0:
		return Event{}, errors.New(`no action: want one of "key", "delete_key", "add_node", "remove_node"`)
	case len(kinds) > 1:
		return Event{}, fmt.Errorf("several actions on one line: %v", kinds)
	case tl.Load != nil && ev.Kind != SetLoad:
		return Event{}, errors.New(`"load" goes with "key"`)
	case tl.Capacity != nil && ev.Kind != AddNode:
		return Event{}, errors.New(`"capacity" goes with "add_node"`)
	case tl.Labels != nil && ev.Kind != AddNode:
		return Event{}, errors.New(`"labels" goes with "add_node"`)
	}
	switch ev.Kind {
	case SetLoad:
		if !(ev.Value >= 0) || math.IsInf(ev.Value, 1) {
			return Event{}, fmt.Errorf("key %q has load %v; want a finite number >= 0", ev.Name, ev.Value)
		}
	case AddNode:
		if !(ev.Value > 0) || math.IsInf(ev.Value, 1) {
			return Event{}, fmt.Errorf("node %q has capacity %v; want a finite number > 0", ev.Name, ev.Value)
		}
		fallthrough
	case RemoveNode:
		if err := assignment.NodeID(ev.Name).Validate(); err != nil {
			return Event{}, err
		}
	}
	return ev, nil
}

// check replays the trace's key and node sets, so that a delete of an unknown key or the
// removal of an absent node is reported before any epoch runs.
func (t *Trace) check(initial []assignment.NodeID) error {
	nodes := map[string]bool{}
	if !t.NodesAtStart {
		for _, id := range initial {
			nodes[string(id)] = true
		}
	}
	keys := map[string]bool{}
	for _, ev := range t.Events {
		var problem string
		switch ev.Kind {
		case SetLoad:
			keys[ev.Name] = true
		case DeleteKey:
			if !keys[ev.Name] {
				problem = fmt.Sprintf("key %q is deleted but does not exist", ev.Name)
			}
			delete(keys, ev.Name)
		case AddNode:
			if nodes[ev.Name] {
				problem = fmt.Sprintf("node %q is added but already exists", ev.Name)
			}
			nodes[ev.Name] = true
		case RemoveNode:
			if !nodes[ev.Name] {
				problem = fmt.Sprintf("node %q is removed but does not exist", ev.Name)
			}
			delete(nodes, ev.Name)
		}
		if problem != "" {
			return fmt.Errorf("%w: line %d: %s", ErrTrace, ev.Line, problem)
		}
	}
	return nil
}
