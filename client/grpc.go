package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
// writes (WithWriteKey) to the slice's primary. A call whose key has no replica to go to now
// (no map yet, no primary while the role is handed over, its node not connected yet) is not
// sent, and an interceptor tries it again, as it does a call the member answered with
// NotOwner (the range moved): each once the router's map changed, or after a short backoff,
// until the call's context ends. A call that went out and failed otherwise is not retried: a
// write may have happened.

// GRPCScheme is the target scheme of the resolver GRPCDialOptions installs: any target
// "sliceplane:///NAME" (NAME names the service for logs; the router's map is the same).
const GRPCScheme = "sliceplane"

const grpcBalancerName = "sliceplane_key"

func init() { balancer.Register(keyBalancerBuilder{}) }

// GRPCDialOptions returns the options that make a grpc-go ClientConn route calls by key
// through router r, which the caller runs:
//
//	conn, err := grpc.NewClient("sliceplane:///counter", append(client.GRPCDialOptions(r), creds)...)
//	resp, err := pb.NewCounterClient(conn).Incr(client.WithWriteKey(ctx, key), req)
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
}

type callKeyCtx struct{}

// WithKey returns ctx with key as its calls' key: a ClientConn made with GRPCDialOptions
// sends them to a replica of key's slice that serves it, chosen by the router's policy.
func WithKey(ctx context.Context, key []byte) context.Context {
	return context.WithValue(ctx, callKeyCtx{}, callKey{key: key})
}

// WithWriteKey returns ctx with key as its calls' key, for calls that write: they go to the
// primary of key's slice, in a cluster with roles (else as WithKey).
func WithWriteKey(ctx context.Context, key []byte) context.Context {
	return context.WithValue(ctx, callKeyCtx{}, callKey{key: key, write: true})
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
// does not serve key (the range moved, or the member is not its primary): the caller's
// GRPCDialOptions interceptor tries the call again once its map has changed.
func NotOwner(key []byte) error {
	st, err := status.New(codes.FailedPrecondition, fmt.Sprintf("sliceplane: this member does not serve key %q now", key)).
		WithDetails(&errdetails.ErrorInfo{Reason: notOwnerReason, Domain: errorDomain})
	if err != nil {
		return status.Error(codes.Internal, err.Error()) // only for a detail that cannot marshal
	}
	return st.Err()
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
	errNoKey     = status.Error(codes.Internal, "client: a call through the sliceplane balancer needs a key: client.WithKey or WithWriteKey")
	errUnmapped  = pickError(noRouteReason, "no map yet")
	errNoPrimary = pickError(noRouteReason, "the key's slice has no primary now (its role is handed over)")
	errNoConn    = pickError(noRouteReason, "the key's replica is not connected")
	// A quarantined key fails at once rather than waiting for a map that serves it: none
	// will until an operator lifts the quarantine.
	errQuarantined = pickError(quarantinedReason, "the key is quarantined: no node serves it until an operator lifts the quarantine")
)

// retryUnrouted returns the interceptor that tries again a call that was not sent, or that a
// member answered with NotOwner, once r's map changed or after a backoff, while ctx lasts.
func retryUnrouted(r *Router) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		wait := 5 * time.Millisecond
		for {
			gen := r.Generation()
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil || (reasonOf(err) != noRouteReason && reasonOf(err) != notOwnerReason) {
				return err
			}
			if !r.awaitChange(ctx, gen, wait) {
				return err
			}
			wait = min(2*wait, 500*time.Millisecond)
		}
	}
}

// awaitChange waits until r's map is past generation gen, or d passed (true), or ctx ended
// (false).
func (r *Router) awaitChange(ctx context.Context, gen uint64, d time.Duration) bool {
	views, stop := r.watchViews()
	defer stop()
	t := time.NewTimer(d)
	defer t.Stop()
	for r.Generation() == gen {
		select {
		case <-views:
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// nodeResolverBuilder builds resolvers that name the nodes its router knows.
type nodeResolverBuilder struct{ r *Router }

func (b *nodeResolverBuilder) Scheme() string { return GRPCScheme }

func (b *nodeResolverBuilder) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	views, stop := b.r.watchViews()
	res := &nodeResolver{stop: make(chan struct{})}
	res.wg.Go(func() {
		defer stop()
		for {
			select {
			case <-views:
				// No addresses yet (the router has a map, not the node list): calls wait for
				// the first state, rather than fail on none.
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
	return &keyBalancer{Balancer: base.NewBalancerBuilder(grpcBalancerName, pb, base.Config{}).Build(cc, opts), pb: pb}
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
	k, ok := info.Ctx.Value(callKeyCtx{}).(callKey)
	if !ok {
		return balancer.PickResult{}, errNoKey
	}
	if p.r == nil {
		return balancer.PickResult{}, errUnmapped
	}
	rep, l, err := p.r.pickFor(k.key, k.write)
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
