package ratelimiter

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/client"
	ratelimitv1 "github.com/sliceplane/sliceplane/examples/ratelimit/proto/ratelimit/v1"
)

// KeyOf is the client.KeyFunc of the rate limiter's API: Take writes (the key's primary
// answers it), Peek reads (any replica). A call without a key is no key's: it runs outside
// the interceptor, and its handler answers InvalidArgument, rather than NotOwner, which its
// caller would send again until its deadline.
func KeyOf(_ string, req any) (key []byte, write, ok bool) {
	switch r := req.(type) {
	case *ratelimitv1.TakeRequest:
		return []byte(r.GetKey()), true, r.GetKey() != ""
	case *ratelimitv1.PeekRequest:
		return []byte(r.GetKey()), false, r.GetKey() != ""
	}
	return nil, false, false
}

// service implements RateLimitService over the member's buckets. It runs behind the
// member's interceptor (client.Member.UnaryServerInterceptor with KeyOf), which answers
// NotOwner for a key the member does not hold in the role the call needs and holds off a
// demotion or release of the key's range until the call has returned: the handlers keep no
// account of ownership.
type service struct {
	ratelimitv1.UnimplementedRateLimitServiceServer
	id      string
	buckets *Buckets
	member  *client.Member
}

// errNoGrant answers a call that ran outside the member's interceptor: nothing says the
// member owns its key, so it cannot be answered.
var errNoGrant = status.Error(codes.Internal, "ratelimiter: the call ran without its key's grant: serve it through client.Member.UnaryServerInterceptor(KeyOf)")

// checkKey refuses a call without a key, or one that did not come through the interceptor.
func checkKey(ctx context.Context, key string) error {
	if key == "" {
		return status.Error(codes.InvalidArgument, "ratelimiter: the request needs a key")
	}
	if _, ok := client.GrantFrom(ctx); !ok {
		return errNoGrant
	}
	return nil
}

func (s *service) Take(ctx context.Context, req *ratelimitv1.TakeRequest) (*ratelimitv1.TakeResponse, error) {
	if err := checkKey(ctx, req.GetKey()); err != nil {
		return nil, err
	}
	allowed, remaining, err := s.buckets.Take(req.GetKey(), req.GetTokens())
	if errors.Is(err, ErrTooMany) {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.member.RecordLoad([]byte(req.GetKey()), 1)
	return &ratelimitv1.TakeResponse{Allowed: allowed, Remaining: remaining, Member: s.id}, nil
}

func (s *service) Peek(ctx context.Context, req *ratelimitv1.PeekRequest) (*ratelimitv1.PeekResponse, error) {
	if err := checkKey(ctx, req.GetKey()); err != nil {
		return nil, err
	}
	s.member.RecordLoad([]byte(req.GetKey()), 1)
	return &ratelimitv1.PeekResponse{Remaining: s.buckets.Peek(req.GetKey()), Member: s.id}, nil
}
