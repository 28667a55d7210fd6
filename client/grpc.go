package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sliceplane/sliceplane/internal/target"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"
)

// Routing inside grpc-go. GRPCDialOptions gives a ClientConn a resolver that names every
// node the router knows, and a balancer whose picker sends each call to the replica of its
// key (WithKey): reads to the one the router's policy picks (its in-flight counts included),
// writes (WithWriteKey) to the slice's primary. A unary call whose key has no replica to go
// to now (no map yet, no primary while the role is handed over, its node not connected) is
// not sent, and an interceptor tries it again, as it does a call the member answered with
// NotOwner (the range moved), by the rule of retry.go. The picker records in the try's
// context the route and the replica it chose, which the rule compares the map with.

// GRPCScheme is the target scheme of the resolver GRPCDialOptions installs:
// "sliceplane:///NAME", where NAME is the router's target (RouterConfig.Target). A router of
// the default target takes any NAME, as before targets, when NAME named the service for logs
// only; a router of another target refuses a NAME that is not its target, as a ClientConn
// meant for one service would otherwise send its calls to another's members.
const GRPCScheme = "sliceplane"

const grpcBalancerName = "sliceplane_key"

func init() { balancer.Register(keyBalancerBuilder{}) }

// GRPCDialOptions returns the options that make a grpc-go ClientConn route calls by key
// through router r, which the caller runs:
//
//	conn, err := grpc.NewClient("sliceplane:///counter", append(client.GRPCDialOptions(r), creds)...)
//	resp, err := pb.NewCounterClient(conn).Incr(client.WithWriteKey(ctx, key), req)
//
// A call needs a key (WithKey, WithIdempotentKey, WithWriteKey), else it fails with
// Internal. A unary call that was not sent (no map yet, no primary while the role is handed
// over, the replica not connected or refusing connections), or that the replica answered
// with NotOwner, is tried again once the key's route in r's map changes so that the call
// would not go where it went (its slice's serving replicas, primary or the primary's
// token), or after a backoff (5 ms doubling to 1 s, within ±20%), whichever comes first,
// until the call's context ends: a replica that answered NotOwner is not asked again before
// the backoff while the route still offers it. A call made with WithIdempotentKey is tried
// again, likewise, after its connection broke before an answer came (Unavailable); any
// other failure is returned as it is: a write that went out may have happened. Router.Stats
// counts the tries again.
//
// A call whose context ends while it waits to be tried again fails with DeadlineExceeded
// (or Canceled), its message saying what the tries met ("client: the key's replicas
// answered NotOwner until the deadline: ..."); the error also matches
// context.DeadlineExceeded with errors.Is. A call through a router that does not run fails
// with FailedPrecondition (errors.Is ErrRouterNotRunning): at once if its Run returned,
// after at most 100 ms (for a Run started just before) if it was never called. A key in a
// quarantined range fails at once with Unavailable. Streaming calls are routed by their key
// too, but not tried again: one that cannot be sent now fails at once (Unavailable).
func GRPCDialOptions(r *Router) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithResolvers(&nodeResolverBuilder{r: r}),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"` + grpcBalancerName + `":{}}]}`),
		grpc.WithChainUnaryInterceptor(retryUnrouted(r)),
	}
}

// callKey is a call's key, in its context.
type callKey struct {
	key   []byte
	write bool
	// idempotent: the call may be sent again after its connection broke (WithIdempotentKey).
	idempotent bool
}

type callKeyCtx struct{}

// WithKey returns ctx with key as its calls' key: a ClientConn made with GRPCDialOptions
// sends them to a replica of key's slice that serves it, chosen by the router's policy. A
// call that was not sent, or that the replica answered NotOwner, is tried again (see
// GRPCDialOptions); one whose connection broke once it went out is not: use
// WithIdempotentKey for reads that may be sent twice.
func WithKey(ctx context.Context, key []byte) context.Context {
	return context.WithValue(ctx, callKeyCtx{}, callKey{key: key})
}

// WithIdempotentKey returns ctx with key as its calls' key, as WithKey, for reads that may be
// sent again after their connection broke before an answer came (status Unavailable, as
// grpc-go ends such a call, or as a member answers that it cannot serve now): they are tried
// again by the rule of GRPCDialOptions, and counted in RouterStats.Broken.
func WithIdempotentKey(ctx context.Context, key []byte) context.Context {
	return context.WithValue(ctx, callKeyCtx{}, callKey{key: key, idempotent: true})
}

// WithWriteKey returns ctx with key as its calls' key, for calls that write: they go to the
// primary of key's slice, in a cluster with roles (else as WithKey). A write is never sent
// again once it may have gone out: only when it was not sent, or was answered NotOwner.
func WithWriteKey(ctx context.Context, key []byte) context.Context {
	return context.WithValue(ctx, callKeyCtx{}, callKey{key: key, write: true})
}

// tryCtx is the context of one try of a unary call, which the interceptor gives the picker:
// it carries the call's key, and the picker records in it the key's route and the replica it
// chose, for the retry rule. One per call, reused by its tries.
type tryCtx struct {
	context.Context
	key   callKey
	route atomic.Pointer[replicaSet]
	to    atomic.Pointer[Replica]
}

func (c *tryCtx) Value(k any) any {
	if k == (callKeyCtx{}) {
		return c
	}
	return c.Context.Value(k)
}

// notOwnerReason marks a NotOwner status; noRouteReason a call the picker did not send, to
// be tried again; quarantinedReason one it did not send and that is not.
const (
	errorDomain       = "sliceplane.io"
	notOwnerReason    = "NOT_OWNER"
	noRouteReason     = "NO_ROUTE"
	quarantinedReason = "QUARANTINED"
)

// NotOwner returns the status error a member's service answers a call for key with when it
// does not serve key (the range moved, or the member is not its primary), having done
// nothing: FailedPrecondition, with an ErrorInfo of reason NOT_OWNER. The caller's
// GRPCDialOptions interceptor tries the call again once the key's route in its map no longer
// offers this member as it was, or after its backoff (see GRPCDialOptions), whichever comes
// first.
func NotOwner(key []byte) error {
	return notOwnerStatus(fmt.Sprintf("sliceplane: this member does not serve key %q now", key)).Err()
}

// IsNotOwner reports whether err says that a member does not own a key in the role the
// request needed: the NotOwner status a member's gRPC service answers (NotOwner,
// NotOwnerError), or ErrNotOwner. A caller routing through GRPCDialOptions or Transport
// sees it only once its retries ended.
func IsNotOwner(err error) bool {
	return errors.Is(err, ErrNotOwner) || reasonOf(err) == notOwnerReason
}

// reasonOf returns the sliceplane reason of a status error, if it has one.
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// pickError makes the error of a call the picker did not send; made once per reason, so that
// a pick allocates nothing.
func pickError(reason, why string) error {
	st, err := status.New(codes.Unavailable, "client: "+why).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain})
	if err != nil {
		panic(err) // a constant detail marshals
	}
	return st.Err()
}

var (
	// A picker may not answer InvalidArgument (gRPC keeps that code for servers): Internal.
	errNoKey     = status.Error(codes.Internal, "client: a call through the sliceplane balancer needs a key: client.WithKey, WithIdempotentKey or WithWriteKey")
	errUnmapped  = pickError(noRouteReason, "no map yet")
	errNoPrimary = pickError(noRouteReason, "the key's slice has no primary now (its role is handed over)")
	errNoConn    = pickError(noRouteReason, "the key's replica is not connected")
	// A quarantined key fails at once rather than waiting for a map that serves it: none
	// will until an operator lifts the quarantine.
	errQuarantined = pickError(quarantinedReason, "the key is quarantined: no node serves it until an operator lifts the quarantine")
)

// retryUnrouted returns the interceptor that tries a unary call again by the rule of
// retry.go. A call without a key goes to the picker as it is, which refuses it.
func retryUnrouted(r *Router) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		k, ok := ctx.Value(callKeyCtx{}).(callKey)
		if !ok {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		rt, err := r.newRetrier(ctx, k.key, k.write)
		if err != nil {
			return err
		}
		at := &tryCtx{key: k}
		for {
			at.Context = ctx
			if gen, ok := r.freshGeneration(); ok {
				at.Context = withMapGeneration(ctx, gen)
			}
			at.route.Store(nil)
			at.to.Store(nil)
			err := invoker(at, method, req, reply, cc, opts...)
			again, end := rt.after(ctx, try{route: at.route.Load(), to: at.to.Load(), cause: grpcCause(err, k.idempotent), err: err})
			switch {
			case again:
			case end != nil:
				return end
			default:
				return err
			}
		}
	}
}

// grpcCause returns why a try that ended with err is tried again, if it is: the picker did
// not send it, or the member answered NotOwner, or (idempotent) it ended Unavailable.
func grpcCause(err error, idempotent bool) retryCause {
	if err == nil {
		return noRetry
	}
	switch reasonOf(err) {
	case noRouteReason:
		return retryNotSent
	case notOwnerReason:
		return retryNotOwner
	case "":
		if idempotent && status.Code(err) == codes.Unavailable {
			return retryBroken
		}
	}
	return noRetry
}

// nodeResolverBuilder builds resolvers that name the nodes its router knows.
type nodeResolverBuilder struct{ r *Router }

func (b *nodeResolverBuilder) Scheme() string { return GRPCScheme }

func (b *nodeResolverBuilder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	if err := b.r.names(t.Endpoint()); err != nil {
		return nil, err
	}
	views, stop := b.r.watchViews()
	res := &nodeResolver{stop: make(chan struct{})}
	res.wg.Go(func() {
		defer stop()
		// Without a first state grpc-go holds calls until their deadline, unable to say
		// why: a state without addresses gives the balancer the router at once, whose
		// picker fails a call as not sent (no map yet), for the interceptor to try it again
		// and, at its deadline, say so.
		if st := b.r.grpcState(); len(st.Addresses) == 0 {
			cc.UpdateState(st) //nolint:errcheck // the balancer refuses no addresses, as meant
		}
		for {
			select {
			case <-views:
				// No addresses yet (the router has a map, not the node list): the state
				// above stands.
				if st := b.r.grpcState(); len(st.Addresses) > 0 {
					cc.UpdateState(st) //nolint:errcheck // an error asks for a re-resolve, which the next view brings
				}
			case <-res.stop:
				return
			}
		}
	})
	return res, nil
}

// nodeResolver pushes the router's nodes to a ClientConn whenever the router publishes a
// view, until closed.
type nodeResolver struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func (*nodeResolver) ResolveNow(resolver.ResolveNowOptions) {}

func (res *nodeResolver) Close() {
	res.once.Do(func() { close(res.stop) })
	res.wg.Wait()
}

type routerAttr struct{}

// grpcState returns the resolver state of the nodes r knows: one address each, the router
// in its attributes for the balancer.
func (r *Router) grpcState() resolver.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := resolver.State{Attributes: attributes.New(routerAttr{}, r)}
	seen := map[string]bool{}
	for _, n := range r.nodes {
		if n.address != "" && !seen[n.address] {
			seen[n.address] = true
			st.Addresses = append(st.Addresses, resolver.Address{Addr: n.address})
		}
	}
	return st
}

// keyBalancerBuilder builds the balancer that routes by key: grpc-go's base balancer (one
// SubConn per address, kept connected), with a picker that asks the router.
type keyBalancerBuilder struct{}

func (keyBalancerBuilder) Name() string { return grpcBalancerName }

func (keyBalancerBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	pb := &keyPickerBuilder{}
	return &keyBalancer{Balancer: base.NewBalancerBuilder(grpcBalancerName, pb, base.Config{}).Build(&keyConn{ClientConn: cc, pb: pb}, opts), pb: pb}
}

// keyConn is the ClientConn the base balancer updates. While none of its connections is
// ready (TransientFailure: every node refuses or is gone), the base balancer's picker fails
// every call with a bare Unavailable, which the interceptor could not tell from a call that
// went out; and it keeps that picker when it leaves TransientFailure for Connecting. keyConn
// puts a key picker with no connection in place of any picker not the key picker's, which
// fails each call as not sent (or as having no route), to be tried again by the retry rule.
type keyConn struct {
	balancer.ClientConn
	pb *keyPickerBuilder
}

func (c *keyConn) UpdateState(s balancer.State) {
	if _, ok := s.Picker.(*keyPicker); !ok {
		s.Picker = c.pb.Build(base.PickerBuildInfo{})
	}
	c.ClientConn.UpdateState(s)
}

// keyBalancer hands the router of the resolver's state to its pickers.
type keyBalancer struct {
	balancer.Balancer
	pb *keyPickerBuilder
}

func (b *keyBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	if r, ok := s.ResolverState.Attributes.Value(routerAttr{}).(*Router); ok {
		b.pb.mu.Lock()
		b.pb.r = r
		b.pb.mu.Unlock()
	}
	return b.Balancer.UpdateClientConnState(s)
}

type keyPickerBuilder struct {
	mu sync.Mutex
	r  *Router
}

func (pb *keyPickerBuilder) Build(info base.PickerBuildInfo) balancer.Picker {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	p := &keyPicker{r: pb.r, conns: make(map[string]balancer.SubConn, len(info.ReadySCs))}
	for sc, sci := range info.ReadySCs {
		p.conns[sci.Address.Addr] = sc
	}
	return p
}

// keyPicker sends a call to the replica of its key, among the SubConns that are ready.
type keyPicker struct {
	r     *Router
	conns map[string]balancer.SubConn // by address
}

func (p *keyPicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	var k callKey
	var at *tryCtx
	switch v := info.Ctx.Value(callKeyCtx{}).(type) {
	case *tryCtx:
		k, at = v.key, v
	case callKey: // a streaming call: no interceptor
		k = v
	default:
		return balancer.PickResult{}, errNoKey
	}
	if p.r == nil {
		return balancer.PickResult{}, errUnmapped
	}
	route, rep, l, err := p.r.pickFor(k.key, k.write)
	if at != nil {
		at.route.Store(route)
		at.to.Store(rep)
	}
	switch {
	case errors.Is(err, ErrNoPrimary):
		return balancer.PickResult{}, errNoPrimary
	case errors.Is(err, ErrQuarantined):
		return balancer.PickResult{}, errQuarantined
	case err != nil:
		return balancer.PickResult{}, errUnmapped
	}
	sc, ok := p.conns[rep.Address]
	if !ok {
		return balancer.PickResult{}, errNoConn
	}
	l.n.Add(1)
	return balancer.PickResult{SubConn: sc, Done: l.finished}, nil
}

// names checks that the endpoint of a ClientConn's "sliceplane:///NAME" may be r's: its
// target, or anything for a router of the default target.
func (r *Router) names(name string) error {
	if mine := target.Name(r.cfg.Target); mine != target.Default && name != mine {
		return fmt.Errorf("client: the ClientConn names target %q (sliceplane:///%s), but its router routes target %q", name, name, mine)
	}
	return nil
}
