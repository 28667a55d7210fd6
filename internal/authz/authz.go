// Package authz decides who may call what on a Sliceplane server. Every server installs one
// Authorizer as its unary and stream interceptor; handlers never check credentials
// themselves.
//
// A caller's identity comes from its client certificate (package mtls: the URI SAN
// spiffe://sliceplane/<kind>/<name>). Its roles are the role named by its kind plus what the
// policy file grants it (Policy). Each method has a Rule: the roles that may call it and,
// for the methods a node calls about itself, the node the request names, which a caller
// allowed only as a node must be. Refusals are Unauthenticated (no identity: no certificate,
// an expired one, another CA) or PermissionDenied (an identity without the role, a node
// acting as another), with a message that says why, and are counted in
// sliceplane_<server>_requests_denied_total{method,reason}.
//
// A server without TLS (a nil *mtls.Source: development on loopback, or --insecure) lets
// every call through; its callers are known only by address.
package authz

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/target"
)

// Refusal reasons, the values of the denied counter's reason label.
const (
	ReasonUnauthenticated = "unauthenticated"
	ReasonRole            = "role"
	ReasonImpersonation   = "impersonation"
	ReasonNoRule          = "no_rule"
	ReasonTarget          = "target"
)

// Authorizer is the interceptor of one server.
type Authorizer struct {
	tls    *mtls.Source
	policy *Policy
	rules  Rules
	denied *prometheus.CounterVec
	log    *slog.Logger
}

// New returns the Authorizer of a server whose TLS is src (nil: plaintext, everything
// allowed), deciding by rules and policy (nil: roles by kind only). Its refusals are counted
// as sliceplane_<server>_requests_denied_total in reg.
func New(server string, src *mtls.Source, policy *Policy, rules Rules, reg prometheus.Registerer, log *slog.Logger) *Authorizer {
	a := &Authorizer{
		tls: src, policy: policy, rules: rules, log: log,
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sliceplane", Subsystem: server, Name: "requests_denied_total",
			Help: "Calls refused by authentication or authorization, by method and reason (unauthenticated, role, impersonation, no_rule).",
		}, []string{"method", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(a.denied)
	}
	return a
}

// ServerOptions returns the credentials and interceptors to build a grpc.Server with.
func (a *Authorizer) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		a.tls.ServerOption(),
		grpc.ChainUnaryInterceptor(a.unary),
		grpc.ChainStreamInterceptor(a.stream),
	}
}

// Caller returns who made the call ctx belongs to, for the audit trail: the SPIFFE ID of an
// authenticated caller, or "plaintext:<address>" on a server without TLS.
func Caller(ctx context.Context) string {
	if id, ok := CallerIdentity(ctx); ok {
		return id.ID
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return "plaintext:" + p.Addr.String()
	}
	return "unknown"
}

// CallerIdentity returns the authenticated identity of the call ctx belongs to.
func CallerIdentity(ctx context.Context) (mtls.Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(mtls.Identity)
	return id, ok
}

type identityKey struct{}

func (a *Authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, g, err := a.authorize(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if err := a.checkSelf(info.FullMethod, g, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *Authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, g, err := a.authorize(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &checkedStream{ServerStream: ss, ctx: ctx, a: a, method: info.FullMethod, grant: g})
}

// grant is what authorize found: who calls, and whether only as the node it must be.
type grant struct {
	id mtls.Identity
	// self, set when the caller is allowed only as a node, names the node a message acts as.
	self func(msg any) (string, bool)
}

// authorize finds the caller's identity and checks its roles against the method's rule.
func (a *Authorizer) authorize(ctx context.Context, method string) (context.Context, grant, error) {
	if a.tls == nil {
		return ctx, grant{}, nil
	}
	id, err := a.identify(ctx)
	if err != nil {
		return ctx, grant{}, a.refuse(method, ReasonUnauthenticated, codes.Unauthenticated, "%v", err)
	}
	rule, ok := a.rules.find(method)
	if !ok {
		return ctx, grant{}, a.refuse(method, ReasonNoRule, codes.PermissionDenied, "%s may not call %s: no rule allows it", id, method)
	}
	if rule.Public {
		return withCaller(ctx, id), grant{id: id}, nil
	}
	in := CallTarget(ctx)
	if why := confined(id, a.policy.Scope(id), rule, in); why != "" {
		if rule.Unconfined {
			return ctx, grant{}, a.refuse(method, ReasonTarget, codes.PermissionDenied, "%s may not call %s: %s", id, method, why)
		}
		return ctx, grant{}, a.refuse(method, ReasonTarget, codes.PermissionDenied, "%s may not call %s in target %q: %s", id, method, in, why)
	}
	roles := a.policy.Roles(id)
	g := grant{id: id}
	switch {
	case roles.anyOf(rule.Roles, RoleNode):
	case roles.has(RoleNode) && contains(rule.Roles, RoleNode):
		g.self = rule.Self
	default:
		return ctx, grant{}, a.refuse(method, ReasonRole, codes.PermissionDenied,
			"%s (roles %s) may not call %s in target %q: it needs one of the roles %s", id, roles, method, in, joinRoles(rule.Roles))
	}
	return withCaller(ctx, id), g, nil
}

// CallTarget returns the target a call names in its metadata (target.MetadataKey), or the
// default target.
func CallTarget(ctx context.Context) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(target.MetadataKey); len(v) > 0 && v[0] != "" {
			return v[0]
		}
	}
	return target.Default
}

// confined says why id may not act in target in under rule, or "" if it may. An identity
// that names a target acts only in it, and never on the registry of targets; one the policy
// scopes to some targets (scope), likewise in those; one that names none acts in every
// target, except members and routers: theirs is the default target, so that certificates
// from before targets reach no other.
func confined(id mtls.Identity, scope []string, rule Rule, in string) string {
	switch {
	case id.Target != "" && rule.Unconfined:
		return fmt.Sprintf("its identity is confined to target %q, and this method acts on every target", id.Target)
	case id.Target != "" && id.Target != in:
		return fmt.Sprintf("its identity is confined to target %q", id.Target)
	case scope != nil && rule.Unconfined:
		return fmt.Sprintf("the policy scopes it to targets %s, and this method acts on every target", strings.Join(scope, ", "))
	case scope != nil && !slices.Contains(scope, in):
		return fmt.Sprintf("the policy scopes it to targets %s", strings.Join(scope, ", "))
	case id.Target == "" && in != target.Default && (id.Kind == string(RoleNode) || id.Kind == string(RoleRouter)):
		return fmt.Sprintf("a %s identity that names no target acts only in target %q; give it spiffe://%s/target/%s/%s/%s",
			id.Kind, target.Default, mtls.TrustDomain, in, id.Kind, id.Name)
	}
	return ""
}

func withCaller(ctx context.Context, id mtls.Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// identify verifies the client's certificate: the TLS handshake only asked for it.
func (a *Authorizer) identify(ctx context.Context) (mtls.Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return mtls.Identity{}, fmt.Errorf("authz: no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return mtls.Identity{}, fmt.Errorf("authz: the connection is not TLS")
	}
	id, err := a.tls.VerifyClient(info.State.PeerCertificates)
	if err != nil {
		return mtls.Identity{}, fmt.Errorf("authz: %w", err)
	}
	return id, nil
}

// checkSelf refuses a node that names another node in msg.
func (a *Authorizer) checkSelf(method string, g grant, msg any) error {
	if g.self == nil {
		return nil
	}
	named, ok := g.self(msg)
	if !ok || named == g.id.Name {
		return nil
	}
	return a.refuse(method, ReasonImpersonation, codes.PermissionDenied,
		"%s may act only as node %q, not as node %q", g.id, g.id.Name, named)
}

func (a *Authorizer) refuse(method, reason string, code codes.Code, format string, args ...any) error {
	return status.Error(code, a.deny(method, reason, fmt.Sprintf(format, args...)))
}

// deny counts and logs the refusal of method (a gRPC method, or the path of a page) for
// reason, and returns msg prefixed by the package.
func (a *Authorizer) deny(method, reason, msg string) string {
	a.denied.WithLabelValues(method, reason).Inc()
	if !strings.HasPrefix(msg, "authz: ") {
		msg = "authz: " + msg
	}
	if a.log != nil {
		a.log.Warn("refused a call", "method", method, "reason", reason, "err", msg)
	}
	return msg
}

// checkedStream checks every message a node sends on a stream it may open only as itself.
type checkedStream struct {
	grpc.ServerStream
	ctx    context.Context
	a      *Authorizer
	method string
	grant  grant
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.a.checkSelf(s.method, s.grant, m)
}
