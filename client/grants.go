package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// ErrNotOwner is what Member.Read and Member.Write return, wrapped, for a key the member
// does not serve in the role the request needs now: not its range, not loaded yet, or not
// its primary. Nothing was done: the request belongs elsewhere, where the caller's router
// sends it once its map shows the change (HTTP: answer 421 Misdirected Request; gRPC:
// return the error as it is, a NotOwner status).
var ErrNotOwner = errors.New("client: this member does not own the key now")

// NotOwnerError is the error of a request for a key the member does not own in the role it
// needs. It is ErrNotOwner (errors.Is), and a gRPC server handler may return it as it is:
// its status is NotOwner(Key)'s, which the caller's GRPCDialOptions interceptor takes for a
// call to send again elsewhere.
type NotOwnerError struct {
	Key []byte
	// Need is the role the request needed: RolePrimary for a write in a cluster with roles;
	// 0 for any role.
	Need Role
	// Have is the grant the member holds the key in, the zero Grant for none.
	Have Grant
}

func (e *NotOwnerError) Error() string {
	switch {
	case e.Have.Role == 0:
		return fmt.Sprintf("client: this member does not serve key %q now", e.Key)
	case e.Need != 0:
		return fmt.Sprintf("client: this member is %s of key %q now, not %s", e.Have.Role, e.Key, e.Need)
	}
	return fmt.Sprintf("client: this member does not own key %q now", e.Key)
}

// Is makes a NotOwnerError ErrNotOwner.
func (e *NotOwnerError) Is(target error) bool { return target == ErrNotOwner }

// GRPCStatus makes a NotOwnerError the NotOwner status of its key when a gRPC handler
// returns it.
func (e *NotOwnerError) GRPCStatus() *status.Status { return notOwnerStatus(e.Error()) }

// notOwnerStatus is the NotOwner status with msg.
func notOwnerStatus(msg string) *status.Status {
	st, err := status.New(codes.FailedPrecondition, msg).WithDetails(&errdetails.ErrorInfo{Reason: notOwnerReason, Domain: errorDomain})
	if err != nil {
		return status.New(codes.Internal, err.Error()) // only for a detail that cannot marshal
	}
	return st
}

// grantView is what the member's application serves, by point, as the member's loop last
// published it (ownership.serving): sorted, disjoint runs, each in one grant, and the grant
// the map gives it next, if another. It is replaced whole.
type grantView struct {
	starts []uint64
	ends   []keyspace.Bound
	grants []Grant
	nexts  []Grant
	gen    uint64 // of the map the member acted on
}

func newGrantView(rs []served, gen uint64) *grantView {
	n := len(rs)
	v := &grantView{starts: make([]uint64, n), ends: make([]keyspace.Bound, n), grants: make([]Grant, n), nexts: make([]Grant, n), gen: gen}
	for i, r := range rs {
		v.starts[i], v.ends[i], v.grants[i], v.nexts[i] = r.r.Start, r.r.End, r.grant, r.next
	}
	return v
}

// find returns the grant of point h, if it is served, and the one the map gives it next
// (zero: none).
func (v *grantView) find(h uint64) (g, next Grant, held bool) {
	i := sort.Search(len(v.starts), func(i int) bool { return v.starts[i] > h }) - 1
	if i < 0 || !v.ends[i].After(h) {
		return Grant{}, Grant{}, false
	}
	return v.grants[i], v.nexts[i], v.grants[i].Role != 0
}

// guards publishes what the application serves and counts the requests that run under a
// grant (Member.Read, Member.Write), so that a call taking a grant away waits for them: a
// demotion for the writes of its points, a release for their reads and writes. A request
// registers under the lock under which a new view is published, so that one registered
// after a publication saw it, and one registered before is counted when the call waits.
type guards struct {
	view atomic.Pointer[grantView] // read without the lock by Grant

	mu        sync.Mutex
	inflight  map[uint64]*flight // by point
	changed   chan struct{}      // closed when a request ends, for waiters
	published chan struct{}      // closed when a view is published, for requests that wait for it
}

// flight counts the requests in flight on one point.
type flight struct{ reads, writes int }

func newGuards() *guards {
	g := &guards{inflight: map[uint64]*flight{}, changed: make(chan struct{}), published: make(chan struct{})}
	g.view.Store(&grantView{})
	return g
}

// publish makes rs what the application serves, as of the map of generation gen.
func (g *guards) publish(rs []served, gen uint64) {
	v := newGrantView(rs, gen)
	g.mu.Lock()
	g.view.Store(v)
	close(g.published)
	g.published = make(chan struct{})
	g.mu.Unlock()
}

// accept returns the grant a request runs under in grant gr (held: the point is served at
// all) of the map of generation gen, and whether it may run in it.
type accept func(gr Grant, held bool, gen uint64) (Grant, bool)

// enter registers a request on point h once ok accepts its grant, and returns the grant it
// runs under, or, refused, the grant the point is served in. A request that ok refuses but
// would take in the grant the map gives the point next (the member is about to acquire it or
// become its primary: the call is due or under way), or whose caller routed it by a newer
// map than the member's, waits until ctx ends for that, rather than be sent back. The
// caller's map is read from ctx only then: a request accepted at once needs none of it.
func (g *guards) enter(ctx context.Context, h uint64, write bool, ok accept) (Grant, bool) {
	var caller uint64
	asked := false
	for {
		have, entered, r := g.tryEnter(h, write, ok)
		if entered {
			return have, true
		}
		if !r.due {
			if !asked {
				caller, asked = callerGenerationOf(ctx), true
			}
			if r.gen >= caller {
				return have, false
			}
		}
		select {
		case <-r.next:
		case <-ctx.Done():
			return have, false
		}
	}
}

// refusal is why tryEnter refused a request: the grant the map gives the point next would
// take it (due), the generation of the map the view was published for, and the channel
// closed at the next publication, to try again then.
type refusal struct {
	due  bool
	gen  uint64
	next <-chan struct{}
}

// tryEnter is one try of enter: the grant, and true if it registered the request; else why
// it refused it.
func (g *guards) tryEnter(h uint64, write bool, ok accept) (Grant, bool, refusal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	v := g.view.Load()
	gr, next, held := v.find(h)
	have, accepted := ok(gr, held, v.gen)
	if !accepted {
		_, due := ok(next, next.Role != 0, v.gen)
		return have, false, refusal{due: due, gen: v.gen, next: g.published}
	}
	f := g.inflight[h]
	if f == nil {
		f = &flight{}
		g.inflight[h] = f
	}
	if write {
		f.writes++
	} else {
		f.reads++
	}
	return have, true, refusal{}
}

// leave ends a request enter registered.
func (g *guards) leave(h uint64, write bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.inflight[h]
	if write {
		f.writes--
	} else {
		f.reads--
	}
	if f.reads == 0 && f.writes == 0 {
		delete(g.inflight, h)
	}
	close(g.changed)
	g.changed = make(chan struct{})
}

// wait waits until no write (and, with reads, no read) runs on a point of r, or ctx ends.
// The view that takes r's grant away must be published first.
func (g *guards) wait(ctx context.Context, r keyspace.Range, reads bool) error {
	for {
		g.mu.Lock()
		busy := false
		for h, f := range g.inflight {
			if r.Contains(h) && (f.writes > 0 || reads && f.reads > 0) {
				busy = true
				break
			}
		}
		changed := g.changed
		g.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("client: requests in flight on %s did not end: %w", r, ctx.Err())
		}
	}
}

// grantCtx carries the grant a request runs under, in its context.
type grantCtx struct{}

// GrantFrom returns the grant the request of ctx runs under, set by the interceptor of
// Member.UnaryServerInterceptor, and whether there is one.
func GrantFrom(ctx context.Context) (Grant, bool) {
	g, ok := ctx.Value(grantCtx{}).(Grant)
	return g, ok
}

// MapGenerationHeader is the HTTP header in which Transport says the generation of the map it
// routed a request by (GRPCDialOptions says it in the call's metadata), while that map is
// less than a second old. A member whose own map is older, asked for a key it does not own,
// waits for its map to catch up before it answers NotOwner: the caller's map may already
// say the key is its (HTTPContext reads it). Calls routed by an older map leave it out, and
// cost nothing for it: every member has had the time to take the map.
const (
	MapGenerationHeader = "Sliceplane-Map-Generation"
	mapGenerationKey    = "sliceplane-map-generation"
)

// withMapGeneration returns ctx with gen, the generation of the router's map, in its outgoing
// gRPC metadata.
func withMapGeneration(ctx context.Context, gen uint64) context.Context {
	return metadata.AppendToOutgoingContext(ctx, mapGenerationKey, strconv.FormatUint(gen, 10))
}

// callerGeneration carries, in a request's context, the generation of the map the caller's
// router routed it by.
type callerGeneration struct{}

// callerGenerationOf returns the generation of the map the request of ctx was routed by: from
// the context (HTTPContext) or its incoming gRPC metadata; 0 if it does not say.
func callerGenerationOf(ctx context.Context) uint64 {
	if g, ok := ctx.Value(callerGeneration{}).(uint64); ok {
		return g
	}
	if v := metadata.ValueFromIncomingContext(ctx, mapGenerationKey); len(v) > 0 {
		g, _ := strconv.ParseUint(v[0], 10, 64) // a malformed one says nothing
		return g
	}
	return 0
}

// HTTPContext returns r's context with what r's caller said of its map (a Transport says the
// generation it routed r by, in MapGenerationHeader), for Member.Read and Write: a member
// whose map is older than the caller's waits for it before it answers that the key is not its.
func HTTPContext(r *http.Request) context.Context {
	g, err := strconv.ParseUint(r.Header.Get(MapGenerationHeader), 10, 64)
	if err != nil {
		return r.Context()
	}
	return context.WithValue(r.Context(), callerGeneration{}, g)
}
