package client

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Transport is an http.RoundTripper that sends each request to a replica of its key, as
// GRPCDialOptions does for grpc-go: Key says a request's key and whether it writes; a read
// goes to the replica the router's policy picks, a write to the key's primary (in a cluster
// with roles). The request's URL keeps its scheme and path; its host becomes the replica's
// address. A request that could not be sent (no map yet, no primary while the role is
// handed over, the replica refused the connection) or that a member answered with 421
// Misdirected Request (it does not serve the key now) is tried again once the map changed,
// or after a backoff, while its context lasts, if its body can be read again (none, or
// GetBody set, as http.NewRequest does for bytes).
// Other answers and failures are returned as they are: a write that went out may have
// happened. A request for a key in a quarantined range fails at once (ErrQuarantined): no
// map serves it until an operator lifts the quarantine.
type Transport struct {
	Router *Router
	// Key returns the request's key and whether it writes. Required.
	Key func(*http.Request) (key []byte, write bool, err error)
	// Base sends the requests; default http.DefaultTransport.
	Base http.RoundTripper
}

// ErrNoKey is returned by Transport for a request whose Key failed.
var ErrNoKey = errors.New("client: the request has no key")

// RoundTrip sends req to a replica of its key, trying again as Transport says.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key, write, err := t.Key(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoKey, err)
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	wait := 5 * time.Millisecond
	for {
		gen := t.Router.Generation()
		resp, err := t.try(req, base, key, write)
		if !t.again(req, resp, err) {
			return resp, err
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // drained for the connection's reuse
			resp.Body.Close()
		}
		if !t.Router.awaitChange(req.Context(), gen, wait) {
			if err == nil {
				err = fmt.Errorf("client: the key's replicas answered 421 until the request's context ended: %w", req.Context().Err())
			}
			return nil, err
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// errUnsent marks a request that was not sent: no replica to send it to.
type errUnsent struct{ err error }

func (e errUnsent) Error() string {
	return "client: not sent: " + strings.TrimPrefix(e.err.Error(), "client: ")
}
func (e errUnsent) Unwrap() error { return e.err }

// try sends req once, to the replica of key.
func (t *Transport) try(req *http.Request, base http.RoundTripper, key []byte, write bool) (*http.Response, error) {
	rep, l, err := t.Router.pickFor(key, write)
	if err != nil {
		return nil, errUnsent{err}
	}
	if rep.Address == "" {
		return nil, errUnsent{fmt.Errorf("node %s's address is not known yet", rep.ID)}
	}
	out := req.Clone(req.Context())
	out.URL.Host, out.Host = rep.Address, ""
	if req.GetBody != nil && req.Body != nil && req.Body != http.NoBody {
		if out.Body, err = req.GetBody(); err != nil {
			return nil, fmt.Errorf("client: reading the request's body again: %w", err)
		}
	}
	l.n.Add(1)
	defer l.n.Add(-1)
	return base.RoundTrip(out)
}

// dialFailed reports whether err is a failure to connect: the request was not sent.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// again reports whether a request that ended with resp and err is tried again.
func (t *Transport) again(req *http.Request, resp *http.Response, err error) bool {
	var unsent errUnsent
	rereadable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	switch {
	case req.Context().Err() != nil || errors.Is(err, ErrQuarantined):
		return false
	case errors.As(err, &unsent) || dialFailed(err):
		return true
	case err == nil && resp.StatusCode == http.StatusMisdirectedRequest:
		return rereadable
	}
	return false
}
