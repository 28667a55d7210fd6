package webview

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/heatmap"
)

type eventJSON struct {
	Seq    uint64  `json:"seq"`
	Time   int64   `json:"time"`
	Kind   string  `json:"kind"`
	Lo     string  `json:"lo"`
	Hi     string  `json:"hi"`
	LoFrac float64 `json:"loFrac"`
	HiFrac float64 `json:"hiFrac"`
	Cause  string  `json:"cause"`
	By     string  `json:"by"`
	What   string  `json:"what"`
}

type gridJSON struct {
	From    uint64      `json:"from"`
	To      uint64      `json:"to"`
	Lo      string      `json:"lo"`
	Hi      string      `json:"hi"`
	W       int         `json:"w"`
	H       int         `json:"h"`
	Seqs    []uint64    `json:"seqs"`
	Times   []int64     `json:"times"`
	Load    loads       `json:"load,omitempty"`
	MaxLoad float64     `json:"maxLoad"`
	Holder  ints        `json:"holder,omitempty"`
	Role    smalls      `json:"role,omitempty"`
	Nodes   []string    `json:"nodes"`
	Events  []eventJSON `json:"events"`
}

// serveHeatmap answers GET api/heatmap: the history rasterized for the canvas.
func (v *View) serveHeatmap(w http.ResponseWriter, r *http.Request) {
	q, err := parseQuery(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := v.leading(r.Context()); err != nil {
		writeError(w, err)
		return
	}
	v.mu.RLock()
	g, err := v.hist.Rasterize(q)
	var events []heatmap.Event
	if err == nil {
		events = v.hist.Events(g.From, g.To, q.Range, maxEvents)
	}
	v.mu.RUnlock()
	if err != nil {
		writeError(w, err)
		return
	}
	out := gridJSON{From: g.From, To: g.To, Lo: hexPoint(q.Range.Start), Hi: hexBound(q.Range.End), W: q.W, H: q.H,
		Seqs: g.Seqs, Times: make([]int64, len(g.Times)), Load: make(loads, len(g.Load)), MaxLoad: g.MaxLoad,
		Holder: g.Holder, Role: g.Role, Nodes: g.Nodes, Events: make([]eventJSON, len(events))}
	for i, t := range g.Times {
		if !t.IsZero() {
			out.Times[i] = t.UnixMilli()
		}
	}
	for i, l := range g.Load {
		out.Load[i] = float32(l)
	}
	for i, e := range events {
		out.Events[i] = eventJSON{Seq: e.Seq, Time: e.At.UnixMilli(), Kind: e.Kind, Lo: hexPoint(e.Range.Start), Hi: hexBound(e.Range.End),
			LoFrac: frac(e.Range.Start), HiFrac: fracBound(e.Range.End), Cause: e.Cause, By: e.By, What: e.What}
		if !e.Range.Valid() { // a split: a point
			out.Events[i].HiFrac = out.Events[i].LoFrac
		}
	}
	if r.URL.Query().Get("format") == "bin" {
		writeBinary(w, out)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// writeBinary writes a grid as the page reads it fastest: its layers are most of it, and
// parsing them as JSON took a browser longer than drawing them. The layout, little-endian:
// the length of the rest's JSON (uint32), that JSON without the layers, zeros up to a multiple
// of 4, then load (float32 a cell), holder (int32 a cell) and role (uint8 a cell).
func writeBinary(w http.ResponseWriter, g gridJSON) {
	load, holder, role := g.Load, g.Holder, g.Role
	g.Load, g.Holder, g.Role = nil, nil, nil
	meta, err := json.Marshal(g)
	if err != nil {
		writeError(w, fmt.Errorf("webview: encoding a grid: %w", err))
		return
	}
	n := len(load)
	buf := make([]byte, 0, 4+len(meta)+3+9*n)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(meta)))
	buf = append(buf, meta...)
	for len(buf)%4 != 0 {
		buf = append(buf, 0)
	}
	for _, l := range load {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(l))
	}
	for _, h := range holder {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(int32(h)))
	}
	buf = append(buf, role...)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(buf) //nolint:errcheck // the client may be gone
}

// parseQuery reads a heatmap query's parameters.
func parseQuery(r *http.Request) (heatmap.Query, error) {
	p := r.URL.Query()
	var q heatmap.Query
	var err error
	if q.Range, err = parseRange(p); err != nil {
		return q, err
	}
	var w, h uint64
	for _, i := range []struct {
		key string
		def uint64
		to  *uint64
	}{{"from", 0, &q.From}, {"to", 0, &q.To}, {"w", 600, &w}, {"h", 256, &h}} {
		if *i.to, err = uintParam(p, i.key, i.def); err != nil {
			return q, err
		}
	}
	q.W, q.H = int(min(w, heatmap.MaxWidth+1)), int(min(h, heatmap.MaxHeight+1))
	node := p.Get("node")
	if err := checkNode(node); err != nil {
		return q, err
	}
	q.Node = assignment.NodeID(node)
	return q, nil
}

type replicaJSON struct {
	Node string `json:"node"`
	Role string `json:"role"`
}

type cellJSON struct {
	Seq      uint64        `json:"seq"`
	Time     int64         `json:"time"`
	Lo       string        `json:"lo"`
	Hi       string        `json:"hi"`
	Slices   int           `json:"slices"`
	Load     float64       `json:"load"`
	Replicas []replicaJSON `json:"replicas"`
	More     int           `json:"more"`
}

// serveCell answers GET api/cell: what the history holds at one point, for the hover.
func (v *View) serveCell(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query()
	seq, err := uintParam(p, "seq", 0)
	if err != nil {
		writeError(w, err)
		return
	}
	at, _, err := pointParam(p, "at")
	if err != nil {
		writeError(w, err)
		return
	}
	if err := v.leading(r.Context()); err != nil {
		writeError(w, err)
		return
	}
	v.mu.RLock()
	c, err := v.hist.CellAt(seq, at)
	v.mu.RUnlock()
	if err != nil {
		writeError(w, err)
		return
	}
	out := cellJSON{Seq: c.Seq, Time: c.At.UnixMilli(), Lo: hexPoint(c.Range.Start), Hi: hexBound(c.Range.End),
		Slices: c.Slices, Load: c.Load, Replicas: []replicaJSON{}, More: c.More}
	for _, rep := range c.Replicas {
		out.Replicas = append(out.Replicas, replicaJSON{Node: rep.Node, Role: rep.Role})
	}
	writeJSON(w, http.StatusOK, out)
}

// serveEvents answers GET api/events: a server-sent event "update" after each change, at
// most one per updateEvery, and a comment every keepAlive; it ends with the request.
func (v *View) serveEvents(w http.ResponseWriter, r *http.Request, log *slog.Logger) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	ka := time.NewTicker(keepAlive)
	defer ka.Stop()
	end := time.NewTimer(maxStream) // the browser reconnects: no stream lives for ever
	defer end.Stop()
	sent, first := uint64(0), true
	for {
		version, changed := v.watch()
		if first || version != sent {
			b := v.Bounds()
			fmt.Fprintf(w, "event: update\ndata: {\"version\":%d,\"last\":%d}\n\n", version, b.Last) //nolint:errcheck // Flush says
			sent, first = version, false
		}
		if err := rc.Flush(); err != nil {
			log.Debug("webview: the event stream ended", "err", err)
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case <-ka.C:
			fmt.Fprint(w, ": keep-alive\n\n") //nolint:errcheck // Flush says
			continue
		case <-changed:
		}
		select { // a burst of changes makes one update
		case <-r.Context().Done():
			return
		case <-time.After(updateEvery):
		}
	}
}

// Compact JSON for the grid's layers, which are most of a heatmap's answer (three numbers a
// pixel): loads with 4 significant digits, enough for a colour; small integers written
// without reflection; and roles as numbers, where encoding/json would write bytes as base64.
type (
	loads  []float32
	ints   []int
	smalls []uint8
)

func (l loads) MarshalJSON() ([]byte, error) {
	return appendArray(len(l), func(b []byte, i int) []byte { return strconv.AppendFloat(b, float64(l[i]), 'g', 4, 32) }), nil
}

func (n ints) MarshalJSON() ([]byte, error) {
	return appendArray(len(n), func(b []byte, i int) []byte { return strconv.AppendInt(b, int64(n[i]), 10) }), nil
}

func (n smalls) MarshalJSON() ([]byte, error) {
	return appendArray(len(n), func(b []byte, i int) []byte { return strconv.AppendUint(b, uint64(n[i]), 10) }), nil
}

func appendArray(n int, elem func([]byte, int) []byte) []byte {
	b := make([]byte, 0, 2+4*n)
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = elem(b, i)
	}
	return append(b, ']')
}
