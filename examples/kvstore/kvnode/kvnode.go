// Package kvnode is a storage node of the example key-value store: it embeds Sliceplane's
// client.Node, which keeps an on-disk store (client/boltstore) holding exactly the items of
// the node's slices, and serves reads of those items over HTTP, counting each as load. A read
// of a key the node does not own is answered 421 with the owners, found with client.Router; so
// is a read of a key of a slice the node is still loading, whose data has not all arrived,
// with the slice's other replicas: a 404 then would say a key that exists does not. A node
// whose data is beyond its freshness bound (client.Node.Fresh) answers reads of its keys 503
// with kvclient.BeyondFreshness and the reason, rather than old data.
package kvnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/boltstore"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/lifecycle"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// Config configures a node.
type Config struct {
	// ID names the node; keep it across restarts, with DataDir, so that it resumes.
	ID string
	// Listen is the HTTP address to serve on; Advertise, where routers should send requests
	// (default: the bound address).
	Listen, Advertise string
	// Assigners are the assigners' gRPC addresses.
	Assigners []string
	// Target is the sharded service the node belongs to (client.NodeConfig.Target); empty
	// for the control plane's default target. A node of another target needs a certificate
	// confined to it (spiffe://sliceplane/target/<T>/node/<ID>).
	Target string
	// DataDir holds the node's store, DataDir/ID.db.
	DataDir string
	// Capacity weighs the node's share of the load; 0 means 1.
	Capacity float64
	// ReportInterval is the time between load reports; 0 means the client's default.
	ReportInterval time.Duration
	// StallTimeout is how long the pull stream may stay silent before the node reconnects
	// and reports its data stale; 0 means the client's default.
	StallTimeout time.Duration
	// FreshnessBound is how far behind its source the node's data may be for it to answer
	// reads; beyond it reads get 503 with kvclient.BeyondFreshness. 0 means the client's
	// default.
	FreshnessBound time.Duration
	// TLS gives the node its certificate (spiffe://sliceplane/node/<ID>): it serves its HTTP
	// API over TLS with client certificates required, and dials the assigners and its
	// distributor with it. The zero TLS is plaintext, allowed on loopback or with Insecure.
	TLS mtls.Config
	// DrainTimeout bounds the drain when Run's context ends (SIGTERM): the node asks for its
	// slices to be handed off and serves them until each has, then leaves. A node still
	// holding slices when it runs out just stops (its lease lapses). 0 stops at once, as a
	// crash would, the assigner moving the slices once the lease lapses.
	DrainTimeout time.Duration
	Logger       *slog.Logger
}

// Server is a running node.
type Server struct {
	cfg    Config
	log    *slog.Logger
	tls    *mtls.Source
	lis    net.Listener
	store  *boltstore.Store
	node   *client.Node
	router *client.Router
	reg    *prometheus.Registry
	reads  *prometheus.CounterVec
	// fresh says whether the node may answer from its data: node.Fresh, but for tests.
	fresh func() (bool, string)
}

// shutdownTimeout bounds how long requests in flight may take once the node stops.
const shutdownTimeout = 5 * time.Second

// New opens the node's store and binds its address; Run serves.
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DataDir == "" {
		return nil, errors.New("kvnode: a data directory is required")
	}
	src, err := cfg.TLS.Load()
	if err != nil {
		return nil, fmt.Errorf("kvnode: %w", err)
	}
	if err := mtls.CheckListen(src, cfg.TLS.Insecure, "the node's HTTP API", cfg.Listen); err != nil {
		return nil, fmt.Errorf("kvnode: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("kvnode: %w", err)
	}
	ctls := client.TLS{Cert: cfg.TLS.Cert, Key: cfg.TLS.Key, CA: cfg.TLS.CA}
	router, err := client.NewRouter(client.RouterConfig{ID: cfg.ID, Assigners: cfg.Assigners, Target: cfg.Target, TLS: ctls, Logger: cfg.Logger.With("part", "router")})
	if err != nil {
		return nil, fmt.Errorf("kvnode: %w", err)
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("kvnode: listening on %s: %w", cfg.Listen, err)
	}
	if cfg.Advertise == "" {
		cfg.Advertise = lis.Addr().String()
	}
	store, err := boltstore.Open(filepath.Join(cfg.DataDir, cfg.ID+".db"))
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("kvnode: %w", err)
	}
	node, err := client.NewNode(client.NodeConfig{ID: cfg.ID, Capacity: cfg.Capacity, Address: cfg.Advertise,
		Assigners: cfg.Assigners, Target: cfg.Target, Store: store, ReportInterval: cfg.ReportInterval,
		StallTimeout: cfg.StallTimeout, FreshnessBound: cfg.FreshnessBound, TLS: ctls, Logger: cfg.Logger})
	if err != nil {
		lis.Close()
		store.Close()
		return nil, fmt.Errorf("kvnode: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("node", cfg.ID), tls: src, lis: lis, store: store, node: node, router: router,
		reg: prometheus.NewRegistry(), fresh: node.Fresh}
	s.registerMetrics()
	return s, nil
}

// registerMetrics registers the node's metrics with s.reg.
func (s *Server) registerMetrics() {
	s.reads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvstore_node_reads_total",
		Help: "Reads served, by outcome: hit, miss (owned, not held), not_mine, loading (owned, its data still arriving) or stale (the node beyond its freshness bound).",
	}, []string{"outcome"})
	clock := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvstore_node_clock",
		Help: "Source clock the node's data reflects.",
	}, func() float64 { return float64(s.node.Clock()) })
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvstore_node_slices",
		Help: "Slices the node holds.",
	}, func() float64 { return float64(len(s.node.Slices())) })
	stale := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvstore_node_data_stale",
		Help: "1 while the node's data may be stale: its distributor has been silent for longer than its stall timeout.",
	}, func() float64 {
		if s.node.Health().Stale {
			return 1
		}
		return 0
	})
	silence := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvstore_node_data_silence_seconds",
		Help: "Time since the node last heard from its distributor.",
	}, func() float64 { return s.node.Health().Silence.Seconds() })
	beyond := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvstore_node_beyond_freshness",
		Help: "1 while the node's data is beyond its freshness bound: it answers reads 503.",
	}, func() float64 {
		if ok, _ := s.fresh(); !ok {
			return 1
		}
		return 0
	})
	stalls := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "kvstore_node_pull_stalls_total",
		Help: "Pull streams the node gave up because they went silent (a stalled link or a hung distributor).",
	}, func() float64 { return float64(s.node.Health().Stalls) })
	s.reg.MustRegister(s.reads, clock, held, stale, silence, beyond, stalls, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// serveHealth says whether the node's data is fresh. It answers 200 either way: the process
// is alive, and a stale node recovers by itself once its pull stream is back.
func (s *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	if ok, why := s.fresh(); !ok {
		fmt.Fprintf(w, "ok; reads refused, %s: %s\n", kvclient.BeyondFreshness, why)
		return
	}
	h := s.node.Health()
	if h.Stale {
		fmt.Fprintf(w, "ok; data stale: no word from the distributor for %s (%d stalled pull streams)\n", h.Silence.Round(time.Millisecond), h.Stalls)
		return
	}
	fmt.Fprintln(w, "ok")
}

// Addr returns the bound HTTP address.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Run serves until ctx ends, drains (Config.DrainTimeout), then stops and closes the store;
// it returns nil then, or the error that stopped the node. It runs once.
func (s *Server) Run(ctx context.Context) error {
	defer s.store.Close()
	// The parts run on past ctx, while the node drains: serving is what lets its slices be
	// handed off without a failed read.
	return lifecycle.Drained(ctx, s.serve, lifecycle.DrainFor(s.node, s.cfg.DrainTimeout, s.log))
}

func (s *Server) serve(ctx context.Context) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second, TLSConfig: s.tls.ServerTLS()}
	s.log.Info("serving", "addr", s.Addr(), "advertise", s.cfg.Advertise, "tls", s.tls.Mode())
	return lifecycle.Run(ctx, "kvnode",
		lifecycle.Part{Name: "node", Run: s.node.Run},
		lifecycle.Part{Name: "router", Run: s.router.Run},
		lifecycle.Part{Name: "http", Run: func(ctx context.Context) error {
			return lifecycle.HTTP(ctx, srv, s.lis, s.tls != nil, shutdownTimeout)
		}},
		lifecycle.Part{Name: "plaintext warning", Run: func(ctx context.Context) error {
			mtls.WarnPlaintext(ctx, s.log, s.tls, "the node's HTTP API", s.Addr())
			return nil
		}},
	)
}

// Handler returns the node's HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+kvclient.KeyPath+"{key...}", s.serveKey)
	mux.HandleFunc("GET "+kvclient.StatePath, s.serveState)
	mux.HandleFunc("GET "+kvclient.ItemsPath, s.serveItems)
	mux.HandleFunc("GET /healthz", s.serveHealth)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	return mux
}

// owns reports whether h lies in one of the node's slices.
func (s *Server) owns(h uint64) bool {
	held := s.node.Slices()
	i := sort.Search(len(held), func(i int) bool { return held[i].End.After(h) })
	return i < len(held) && held[i].Contains(h)
}

// misdirect answers 421 with the replicas that serve key's slice, as the router sees them,
// and counts the read under outcome.
func (s *Server) misdirect(w http.ResponseWriter, key []byte, outcome, why string) {
	s.reads.WithLabelValues(outcome).Inc()
	m := kvclient.Misdirected{Error: why, Owners: []kvclient.Owner{}}
	if route, err := s.router.Lookup(key); err == nil {
		for _, rep := range route.Replicas {
			// A node that loads the slice is no owner of it yet, whatever a map that has
			// not caught up says.
			if outcome != "loading" || rep.ID != s.cfg.ID {
				m.Owners = append(m.Owners, kvclient.Owner{ID: rep.ID, Address: rep.Address})
			}
		}
	}
	writeJSON(w, http.StatusMisdirectedRequest, m)
}

func (s *Server) serveKey(w http.ResponseWriter, r *http.Request) {
	key := []byte(r.PathValue("key"))
	if len(key) == 0 {
		http.Error(w, "kvnode: empty key", http.StatusBadRequest)
		return
	}
	h := client.Hash(key)
	switch {
	case !s.owns(h):
		s.misdirect(w, key, "not_mine", "not mine")
		return
	case s.node.Loading(h):
		// The node holds the slice, but its data is still arriving: a miss here would
		// not mean that the key does not exist.
		s.misdirect(w, key, "loading", "not mine yet: loading")
		return
	}
	if ok, why := s.fresh(); !ok {
		// Neither a value nor a miss from data that may be old: the reader goes to
		// another replica, which routers prefer while this node is stale. A 421 above
		// gives no data, only where to go.
		s.reads.WithLabelValues("stale").Inc()
		http.Error(w, fmt.Sprintf("kvnode: %s: %s", kvclient.BeyondFreshness, why), http.StatusServiceUnavailable)
		return
	}
	s.node.RecordLoad(key, 1)
	clock := s.node.Clock()
	guard := s.node.GuardRead(key)
	it, ok, err := s.store.Get(r.Context(), key)
	switch {
	case err != nil:
		s.log.Error("reading the store", "key", string(key), "err", err)
		http.Error(w, "kvnode: reading the store failed", http.StatusInternalServerError)
		return
	case (!ok || !it.HasValue) && !guard.Unchanged():
		// The slice left (its handoff ended, or a snapshot began) around the read of the
		// store: the item may be gone with it, which says nothing of the key.
		s.misdirect(w, key, "not_mine", "not mine any more")
		return
	case !ok || !it.HasValue:
		s.reads.WithLabelValues("miss").Inc()
		http.Error(w, "kvnode: no such key", http.StatusNotFound)
		return
	}
	s.reads.WithLabelValues("hit").Inc()
	w.Header().Set(kvclient.ClockHeader, strconv.FormatUint(clock, 10))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Write(it.Value) //nolint:errcheck // the client went away
}

// serveState reports the slices of the store, like serveItems its items.
func (s *Server) serveState(w http.ResponseWriter, r *http.Request) {
	st := kvclient.State{ID: s.cfg.ID, Clock: s.node.Clock(), Cursor: s.node.Cursor().String(), Slices: []kvclient.Slice{}}
	st.Fresh, st.StaleReason = s.fresh()
	held, err := s.store.Slices(r.Context())
	if err != nil {
		s.log.Error("reading the store's slices", "err", err)
		http.Error(w, "kvnode: reading the store failed", http.StatusInternalServerError)
		return
	}
	for _, r := range held {
		st.Slices = append(st.Slices, kvclient.SliceOf(r))
	}
	if id, _, ok := s.node.Distributor(); ok {
		st.Distributor = id
	}
	writeJSON(w, http.StatusOK, st)
}

// serveItems streams every item the store holds, one JSON object per line. It reads the
// store, not the node's view of its slices, so that a check sees what is really there.
func (s *Server) serveItems(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	err := s.store.Items(r.Context(), func(it client.Item) error { return enc.Encode(it) })
	if err != nil {
		// Headers are gone: cut the stream so the reader sees a broken body, not a short list.
		s.log.Error("listing the store", "err", err)
		panic(http.ErrAbortHandler)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}
