package assigner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/grpcserver"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/target/registry"
	"github.com/sliceplane/sliceplane/internal/webview"
)

// Server is the assigner: it serves the API of every target, and leads the targets it owns
// among the live assigners (package target), each on its own election.
type Server struct {
	cfg      Config
	log      *slog.Logger
	grpc     *grpcserver.Server
	health   *health.Server // grpc's
	registry *registry.Registry

	mu      sync.Mutex
	targets map[string]*running // by name; the default target always
}

// running is a target and what stops it.
type running struct {
	*served
	record registry.Record
	// ownSource is the source the server opened for the target (its config's), closed
	// with it; nil for an etcd prefix or the default target's, which the command owns.
	ownSource *postgres.Source
	places    chan placement // the latest placement only
	cancel    context.CancelFunc
	done      chan struct{}
}

// New returns a server listening on cfg.Listen (and cfg.MetricsListen); Run serves.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Client == nil {
		return nil, errors.New("assigner: no etcd client")
	}
	s := &Server{cfg: cfg, log: cfg.Logger, registry: registry.New(cfg.Client, cfg.Prefix), targets: map[string]*running{}}
	srv, err := grpcserver.New(grpcserver.Config{
		Name: "assigner", Listen: cfg.Listen, Advertise: cfg.Advertise, MetricsListen: cfg.MetricsListen,
		MaxRecvBytes: cfg.MaxRequestBytes, Rules: authz.AssignerRules(), Policy: cfg.Policy, TLS: cfg.TLS,
		Registry: cfg.Registry, Logger: cfg.Logger, Grace: 10 * time.Second,
		Pages: []grpcserver.Page{{Path: webview.Path, Role: authz.RoleViewer, Handler: http.HandlerFunc(s.servePage)}},
	})
	if err != nil {
		return nil, err
	}
	s.grpc, s.health = srv, srv.Health()
	s.cfg.Advertise = srv.Advertise()
	def, err := newTarget(target.Default, s.cfg, cfg.Registry, s.health)
	if err != nil {
		return nil, err
	}
	s.targets[target.Default] = &running{served: def, record: registry.Record{Name: target.Default}, places: make(chan placement, 1)}
	d := dispatch{s: s}
	pb.RegisterAssignmentServiceServer(srv, d)
	pb.RegisterQuantaServiceServer(srv, d)
	pb.RegisterNodeServiceServer(srv, nodeDispatch{s: s})
	pb.RegisterAdminServiceServer(srv, d)
	pb.RegisterTargetServiceServer(srv, targetAPI{s: s})
	return s, nil
}

// Addr returns the address the gRPC server listens on.
func (s *Server) Addr() string { return s.grpc.Addr() }

// MetricsAddr returns the address of the metrics endpoint, or "".
func (s *Server) MetricsAddr() string { return s.grpc.MetricsAddr() }

// Run serves until ctx ends, then stops gracefully: it gives up every leadership at once (so
// another assigner takes over without waiting for the lease), which ends the streams, and
// lets calls in flight finish for up to 10 s.
func (s *Server) Run(ctx context.Context) error {
	return s.grpc.Run(ctx, grpcserver.Task{Name: "targets", Run: s.place})
}

// lookup returns the target a call names in its metadata (target.MetadataKey), the default
// one if it names none.
func (s *Server) lookup(ctx context.Context) (*served, error) { return s.named(authz.CallTarget(ctx)) }

func (s *Server) named(name string) (*served, error) {
	s.mu.Lock()
	r, ok := s.targets[target.Name(name)]
	s.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "assigner: no target %q (slicectl targets lists them)", name)
	}
	return r.served, nil
}

// servePage serves the web view of the target the page's ?target= names, and at api/targets
// the targets the caller may see, with their leaders, for the page's picker.
func (s *Server) servePage(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == webview.Path+"api/targets" {
		s.serveTargets(w, r)
		return
	}
	t, err := s.named(r.URL.Query().Get("target"))
	if err != nil {
		http.Error(w, status.Convert(err).Message(), http.StatusNotFound)
		return
	}
	t.page.ServeHTTP(w, r)
}

// serveTargets lists the targets and their leaders: all of them, or only those a caller
// confined to one, or scoped to some by the policy, may act in.
func (s *Server) serveTargets(w http.ResponseWriter, r *http.Request) {
	admits := func(string) bool { return true }
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		if id, err := mtls.IdentityOf(r.TLS.PeerCertificates[0]); err == nil {
			admits = func(name string) bool { return s.cfg.Policy.Admits(id, name) }
		}
	}
	type entry struct {
		Name   string `json:"name"`
		Leader string `json:"leader"`
	}
	out := struct {
		Targets []entry `json:"targets"`
	}{Targets: []entry{}}
	for _, name := range s.Targets() {
		if !admits(name) {
			continue
		}
		t, err := s.named(name)
		if err != nil {
			continue // deleted meanwhile
		}
		out.Targets = append(out.Targets, entry{Name: name, Leader: t.leader()})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out) // the client may be gone
}

// place runs every target this assigner should run, until ctx ends: it declares the
// targets of Config.Targets, keeps this assigner among the live ones, follows the registry
// and the live assigners, and tells each target what this assigner is to it.
func (s *Server) place(ctx context.Context) error {
	defer s.stopAll()
	observer, err := s.session(ctx)
	if err != nil {
		return nil // ctx ended
	}
	defer observer.Orphan()
	s.declare(ctx)
	for ctx.Err() == nil {
		err := s.follow(ctx, observer)
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("following the targets and assigners failed; starting over", "err", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
	return nil
}

// session opens the etcd session the targets observe their elections with, retrying until
// etcd answers or ctx ends.
func (s *Server) session(ctx context.Context) (*concurrency.Session, error) {
	for {
		observer, err := concurrency.NewSession(s.cfg.Client, concurrency.WithTTL(int(s.cfg.SessionTTL/time.Second)), concurrency.WithContext(ctx))
		if err == nil || ctx.Err() != nil {
			return observer, err
		}
		s.log.Warn("could not open an etcd session; retrying", "err", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

// declare writes the targets of Config.Targets into the registry, creating those that are
// not there and updating those that differ; targets it does not name are left as they are.
// It tries a few times, a second apart, then leaves them undeclared (and says so): a
// registry it cannot read must not keep the other targets from running.
func (s *Server) declare(ctx context.Context) {
	if len(s.cfg.Targets) == 0 {
		return
	}
	for try := 1; ; try++ {
		err := s.declareOnce(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		if try == 5 {
			s.log.Error("could not declare the targets of --targets; they are left as the registry has them", "err", err)
			return
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
	}
}

func (s *Server) declareOnce(ctx context.Context) error {
	have, _, err := s.registry.List(ctx)
	if err != nil {
		return err
	}
	current := map[string]registry.Record{}
	for _, r := range have {
		current[r.Name] = r
	}
	for _, want := range s.cfg.Targets {
		old, exists := current[want.Name]
		if exists && old.Config.Equal(want.Config) {
			continue
		}
		action := map[bool]string{true: "update", false: "create"}[exists]
		want.Changed = registry.Change{Action: action, By: "assigner:" + s.cfg.Advertise + " (--targets)", At: time.Now()}
		switch err := s.registry.Put(ctx, want, !exists); {
		case errors.Is(err, registry.ErrExists): // another assigner declared it meanwhile
		case err != nil:
			return err
		default:
			s.log.Info("audit: declared a target of --targets", "target", want.Name, "action", action)
		}
	}
	return nil
}

// follow registers this assigner among the live ones and, until that registration or a
// watch ends, runs the registered targets and places them.
func (s *Server) follow(ctx context.Context, observer *concurrency.Session) error {
	reg, err := membership.RegisterAssigner(ctx, s.cfg.Client, s.cfg.Prefix, s.cfg.Advertise, s.cfg.SessionTTL)
	if err != nil {
		return err
	}
	defer reg.Close()
	live, liveRev, err := membership.LoadSet(ctx, s.cfg.Client, s.cfg.Prefix+membership.AssignersDir)
	if err != nil {
		return err
	}
	regs, regRev, err := s.registry.Raw(ctx)
	if err != nil {
		return err
	}
	sizesDir := target.Sizes(s.cfg.Prefix)
	sizes, sizesRev, err := membership.LoadSet(ctx, s.cfg.Client, sizesDir)
	if err != nil {
		return err
	}
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	lives := membership.WatchSet(watchCtx, s.cfg.Client, s.cfg.Prefix+membership.AssignersDir, live, liveRev)
	registered := s.registry.Watch(watchCtx, regs, regRev)
	sized := membership.WatchSet(watchCtx, s.cfg.Client, sizesDir, sizes, sizesRev)
	for {
		if err := s.reconcile(ctx, observer, regs); err != nil {
			s.log.Error("the registry of targets cannot be read; the targets run as they were", "err", err)
		}
		s.spread(slices.Sorted(maps.Keys(live)), sizes)
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case <-reg.Done():
			return errors.New("this assigner's lease among the live ones was lost")
		case live, ok = <-lives:
		case regs, ok = <-registered:
		case sizes, ok = <-sized:
		}
		if !ok {
			return errors.New("a watch ended")
		}
	}
}

// spread tells every target what this assigner is to it among the live assigners, by their
// sizes as their leaders published them (target.Place).
func (s *Server) spread(live []string, published map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sizes := make(map[string]int64, len(s.targets))
	for name := range s.targets {
		sizes[name], _ = strconv.ParseInt(published[name], 10, 64) // none, or unreadable: light
	}
	placed := target.Place(sizes, live, s.cfg.HeavySlices)
	for name, r := range s.targets {
		ranked := placed[name]
		p := placement{role: target.Of(ranked, s.cfg.Advertise)}
		if len(ranked) > 0 {
			p.owner = ranked[0]
		}
		select { // the latest placement replaces one not yet taken
		case <-r.places:
		default:
		}
		r.places <- p
	}
}

// reconcile runs the targets the registry holds (and the default one), stops those it no
// longer holds, and applies the configs that changed: in place where the running term can
// take them (retune), by a restart, and so a new term, where it cannot.
func (s *Server) reconcile(ctx context.Context, observer *concurrency.Session, set map[string]string) error {
	recs, err := registry.Decode(set)
	if err != nil {
		return err
	}
	want := map[string]registry.Record{target.Default: {Name: target.Default}}
	for _, r := range recs {
		want[r.Name] = r
	}
	// The stale targets stop outside the lock, each still in the map meanwhile, so that the
	// calls of every other target go on, and calls of a stopping one are told it has no
	// leader here (Unavailable: clients try again) rather than that it does not exist.
	var stale []*running
	s.mu.Lock()
	for name, r := range s.targets {
		if w, ok := want[name]; !ok || !w.Config.Equal(r.record.Config) && !s.retune(r, w) {
			stale = append(stale, r)
		}
	}
	s.mu.Unlock()
	for _, r := range stale {
		s.stop(r)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range stale {
		delete(s.targets, r.name)
	}
	for name, rec := range want {
		r, ok := s.targets[name]
		if !ok {
			if r, err = s.start(ctx, rec); err != nil {
				s.log.Error("cannot run a target; it is left unserved", "target", name, "err", err)
				continue
			}
			s.targets[name] = r
		}
		if r.done == nil {
			r.run(ctx, observer)
		}
	}
	return nil
}

// retune gives running target r its new config rec in place, and reports whether it could:
// everything but the role model and the exclusive mode, which a term keeps (a primary's
// lease and fence mean nothing under another model), and the source, whose clock stamps
// the term's quanta, applies at the leader's next pass.
func (s *Server) retune(r *running, rec registry.Record) bool {
	cc, err := s.coreOf(rec)
	if err != nil { // the registry checks a config before it stores it
		r.log.Error("the target's new config is invalid; it keeps its config", "err", err)
		return true
	}
	if old := r.coreCfg.Load(); cc.Roles != old.Roles || cc.Exclusive != old.Exclusive ||
		!maps.Equal(rec.Config.Source, r.record.Config.Source) {
		return false
	}
	r.reconfigure(cc)
	r.record = rec
	r.log.Info("the target's config changed", "config", string(rec.Config.Redacted().Marshal()))
	return true
}

// coreOf returns the core config of target rec: the flags' for the default target, the
// flags' under its target.yaml for the others.
func (s *Server) coreOf(rec registry.Record) (core.Config, error) {
	if rec.Name == target.Default {
		return s.cfg.Core, nil
	}
	cc, err := rec.Config.Apply(*s.cfg.rawCore)
	if err == nil {
		err = fillCore(&cc)
	}
	return cc, err
}

// start builds the runtime of target rec, opening its source if its config names one (its
// etcd data prefix otherwise; the default target's is the flags').
func (s *Server) start(ctx context.Context, rec registry.Record) (*running, error) {
	cfg := s.cfg
	cc, err := s.coreOf(rec)
	if err != nil {
		return nil, err
	}
	cfg.Core = cc
	r := &running{record: rec, places: make(chan placement, 1)}
	if rec.Name != target.Default {
		cfg.Source = nil
		opts, has, err := rec.Config.SourceOptions()
		if err == nil && has {
			// The leader follows only the clock: no slot.
			r.ownSource, err = opts.Open(ctx, "", s.log.With("target", rec.Name), nil)
			cfg.Source = r.ownSource
		}
		if err != nil {
			return nil, fmt.Errorf("assigner: the source of target %s: %w", rec.Name, err)
		}
	}
	if r.served, err = newTarget(rec.Name, cfg, s.cfg.Registry, s.health); err != nil {
		r.closeSource()
		return nil, err
	}
	return r, nil
}

// closeSource closes the source the server opened for r, if it did.
func (r *running) closeSource() {
	if r.ownSource != nil {
		r.ownSource.Close()
	}
}

// run supervises r on a goroutine of its own, until halt.
func (r *running) run(ctx context.Context, observer *concurrency.Session) {
	ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		r.supervise(ctx, observer, r.places)
	}()
}

// halt ends r's supervision, if it runs, and waits for it: its campaign and its leadership
// end, its lease is revoked.
func (r *running) halt() {
	if r.done == nil {
		return
	}
	r.cancel()
	<-r.done
	r.done = nil
}

// stop ends r: its campaign, its leadership if it leads, its metrics and health status.
func (s *Server) stop(r *running) {
	r.halt()
	r.closeSource()
	if r.name != target.Default {
		r.collectors.unregisterAll()
	}
	r.health.SetServingStatus(r.healthName, 0) // UNKNOWN: no such service any more
	r.log.Info("stopped the target")
}

// stopAll stops every target, as the server stops: their leaderships end, their leases are
// revoked, the sources the server opened are closed.
func (s *Server) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.targets {
		r.halt()
		r.closeSource()
	}
}

// Targets returns the names of the targets this assigner runs.
func (s *Server) Targets() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.targets))
}
