package webview

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/heatmap"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Path is where the assigner serves the view.
const Path = "/ui/"

//go:embed static
var static embed.FS

// Bounds of the live stream: updates no closer than updateEvery, a comment every keepAlive
// so that proxies and the browser keep an idle stream open, a new stream every maxStream;
// and of the events a heatmap carries.
const (
	updateEvery = 250 * time.Millisecond
	keepAlive   = 15 * time.Second
	maxStream   = 10 * time.Minute
	maxEvents   = 5000
)

// Handler returns the view's HTTP handler, to be mounted at Path (it expects the prefix). It
// does not check who calls: the assigner mounts it behind authz.Authorizer.HTTP.
func (v *View) Handler(log *slog.Logger) http.Handler {
	files, _ := fs.Sub(static, "static") // static is embedded: the directory is there
	mux := http.NewServeMux()
	mux.Handle("GET "+Path, http.StripPrefix(Path, http.FileServerFS(files)))
	mux.HandleFunc("GET "+Path+"api/state", v.serveState)
	mux.HandleFunc("GET "+Path+"api/heatmap", v.serveHeatmap)
	mux.HandleFunc("GET "+Path+"api/cell", v.serveCell)
	mux.HandleFunc("GET "+Path+"api/events", func(w http.ResponseWriter, r *http.Request) { v.serveEvents(w, r, log) })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		mux.ServeHTTP(w, r)
	})
}

// errBadRequest marks a query the page should not have sent.
var errBadRequest = errors.New("webview: bad request")

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client may be gone
}

// writeError answers err with the status its kind calls for.
func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, errBadRequest), errors.Is(err, heatmap.ErrInvalid):
		code = http.StatusBadRequest
	case status.Code(err) == codes.Unavailable:
		code = http.StatusServiceUnavailable
	}
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Message()
	}
	if !strings.HasPrefix(msg, "webview: ") {
		msg = "webview: " + msg
	}
	writeJSON(w, code, map[string]string{"error": msg})
}

// rawProto is a message written as protojson inside the JSON of a response.
type rawProto struct{ m proto.Message }

func (p rawProto) MarshalJSON() ([]byte, error) {
	return protojson.MarshalOptions{UseProtoNames: false, EmitUnpopulated: true}.Marshal(p.m)
}

type historyJSON struct {
	First     uint64    `json:"first"`
	Last      uint64    `json:"last"`
	FirstTime time.Time `json:"firstTime"`
	LastTime  time.Time `json:"lastTime"`
	Columns   int       `json:"columns"`
	Capacity  int       `json:"capacity"`
	MaxCells  int       `json:"maxCells"`
	Bytes     int       `json:"bytes"`
}

type passJSON struct {
	Time    time.Time `json:"time"`
	Explain rawProto  `json:"explain"`
}

type quantumJSON struct {
	Term       uint64    `json:"term"`
	Seq        uint64    `json:"seq"`
	Generation uint64    `json:"generation"`
	Time       time.Time `json:"time"`
	Cause      string    `json:"cause"`
	By         string    `json:"by"`
	Ops        []string  `json:"ops"`
}

type stateJSON struct {
	Leader        bool              `json:"leader"`
	LeaderAddress string            `json:"leaderAddress"`
	Error         string            `json:"error,omitempty"`
	Status        *rawProto         `json:"status,omitempty"`
	Nodes         []rawProto        `json:"nodes"`
	NodeStates    map[string]string `json:"nodeStates"`
	Zones         map[string]string `json:"zones"`
	Passes        []passJSON        `json:"passes"`
	Quanta        []quantumJSON     `json:"quanta"`
	History       historyJSON       `json:"history"`
}

func (v *View) serveState(w http.ResponseWriter, r *http.Request) {
	out := stateJSON{Nodes: []rawProto{}, NodeStates: map[string]string{}, Zones: map[string]string{}, Passes: []passJSON{}, Quanta: []quantumJSON{}}
	st, err := v.backend.Status(r.Context(), &pb.StatusRequest{})
	if err != nil {
		writeError(w, err)
		return
	}
	out.Leader, out.LeaderAddress, out.Status = st.GetLeader(), st.GetLeaderAddress(), &rawProto{st}
	if out.Leader {
		nodes, err := v.backend.ListNodes(r.Context(), &pb.ListNodesRequest{})
		if err != nil {
			out.Error = fmt.Sprintf("webview: listing the nodes: %s", status.Convert(err).Message())
		}
		for _, n := range nodes.GetNodes() {
			out.Nodes = append(out.Nodes, rawProto{n})
			out.NodeStates[n.GetNode().GetId()] = nodeState(n, st.GetQuarantined())
			if v.zoneLabel != "" {
				out.Zones[n.GetNode().GetId()] = n.GetLabels()[v.zoneLabel]
			}
		}
	}
	v.fillPast(&out)
	writeJSON(w, http.StatusOK, out)
}

// fillPast adds what the View keeps: passes and quanta newest first, the history's bounds.
func (v *View) fillPast(out *stateJSON) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for i := len(v.passes) - 1; i >= 0; i-- {
		out.Passes = append(out.Passes, passJSON{Time: v.passes[i].At, Explain: rawProto{v.passes[i].Explain}})
	}
	for i := len(v.quanta) - 1; i >= 0; i-- {
		q := v.quanta[i]
		out.Quanta = append(out.Quanta, quantumJSON{Term: q.Term, Seq: q.Seq, Generation: q.Generation, Time: q.At, Cause: q.Cause, By: q.By, Ops: q.Ops})
	}
	b := v.hist.Bounds()
	out.History = historyJSON{First: b.First, Last: b.Last, FirstTime: b.FirstTime, LastTime: b.LastTime, Columns: b.Columns,
		Capacity: v.cfg.Columns, MaxCells: v.cfg.Cells, Bytes: v.hist.Bytes()}
}

// nodeState says in a word how a node is: quarantined (named by a quarantine), stale,
// draining, loading, or serving.
func nodeState(n *pb.NodeInfo, quarantined []*pb.Quarantine) string {
	for _, q := range quarantined {
		for _, id := range q.GetNodes() {
			if id == n.GetNode().GetId() {
				return "quarantined"
			}
		}
	}
	switch {
	case n.GetStale():
		return "stale"
	case n.GetDraining():
		return "draining"
	case n.GetLoading() > 0:
		return "loading"
	}
	return "serving"
}

// leading refuses what only a leader's history can answer.
func (v *View) leading(ctx context.Context) error {
	st, err := v.backend.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return err
	}
	if !st.GetLeader() {
		if st.GetLeaderAddress() != "" {
			return status.Errorf(codes.Unavailable, "not the leader; the leader is at %s", st.GetLeaderAddress())
		}
		return status.Error(codes.Unavailable, "not the leader, and no leader is known yet")
	}
	return nil
}

// hexPoint formats a point as the page reads it: 16 hex digits, "0000000000000000" for the
// end of the space as an upper bound.
func hexPoint(p uint64) string { return fmt.Sprintf("%016x", p) }

func hexBound(b keyspace.Bound) string {
	if b.IsEnd() {
		return hexPoint(0)
	}
	return hexPoint(b.Point())
}

func frac(p uint64) float64 { return float64(p) / math.Exp2(64) }

func fracBound(b keyspace.Bound) float64 {
	if b.IsEnd() {
		return 1
	}
	return frac(b.Point())
}

// parseRange reads lo and hi (16 hex digits; hi 0 or absent: the end of the space).
func parseRange(q url.Values) (keyspace.Range, error) {
	r := keyspace.Full()
	lo, _, err := pointParam(q, "lo")
	if err != nil {
		return r, err
	}
	hi, hasHi, err := pointParam(q, "hi")
	if err != nil {
		return r, err
	}
	r.Start = lo
	if hasHi && hi != 0 {
		r.End = keyspace.At(hi)
	}
	if !r.Valid() {
		return r, fmt.Errorf("%w: the range %s is empty", errBadRequest, r)
	}
	return r, nil
}

// pointParam reads a point of the space (16 hex digits), 0 and false when absent.
func pointParam(q url.Values, key string) (uint64, bool, error) {
	s := q.Get(key)
	if s == "" {
		return 0, false, nil
	}
	p, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%w: %s %q: want 16 hex digits", errBadRequest, key, s)
	}
	return p, true, nil
}

// uintParam reads a non-negative integer parameter, def when absent.
func uintParam(q url.Values, key string, def uint64) (uint64, error) {
	s := q.Get(key)
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %q: want a non-negative integer", errBadRequest, key, s)
	}
	return n, nil
}

// checkNode refuses a node parameter no node could have.
func checkNode(id string) error {
	if len(id) > 256 {
		return fmt.Errorf("%w: node: %d bytes; at most 256", errBadRequest, len(id))
	}
	return nil
}
