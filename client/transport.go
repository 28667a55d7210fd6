package client

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
	"syscall"
)

// Transport is an http.RoundTripper that sends each request to a replica of its key, as
// GRPCDialOptions does for grpc-go: Key says a request's key and whether it writes; a read
// goes to the replica the router's policy picks, a write to the key's primary (in a cluster
// with roles). The request's URL keeps its scheme and path; its host becomes the replica's
// address.
//
// A request that was not sent (no map yet, no primary while the role is handed over, the
// replica's address not known yet, the connection refused) or that a member answered with
// 421 Misdirected Request (it does not serve the key now: the HTTP NotOwner) is tried
// again, if its body can be read again (none, or GetBody set, as http.NewRequest does for
// bytes), once the key's route in the router's map changes so that the request would not go
// where it went (its slice's serving replicas, primary or the primary's token), or after a
// backoff (5 ms doubling to 1 s, within ±20%), whichever comes first, until the request's
// context ends: a member that answered 421 is not asked again before the backoff while the
// route still offers it. With RetryIdempotent, an idempotent request is tried again,
// likewise, after its connection broke before an answer came. Other answers and failures
// are returned as they are: a write that went out may have happened. Router.Stats counts
// the tries again.
//
// A request whose context ends while it waits to be tried again fails with an error that
// matches its context's error (errors.Is context.DeadlineExceeded) and says what the tries
// met ("client: the key's replicas answered NotOwner until the deadline: m1 answered 421
// Misdirected Request"). A request through a router that does not run fails with
// ErrRouterNotRunning: at once if its Run returned, after at most 100 ms (for a Run started
// just before) if it was never called. A key in a quarantined range fails at once
// (errors.Is ErrQuarantined): no map serves it until an operator lifts the quarantine.
type Transport struct {
	Router *Router
	// Key returns the request's key and whether it writes. Required.
	Key func(*http.Request) (key []byte, write bool, err error)
	// Base sends the requests; default http.DefaultTransport.
	Base http.RoundTripper
	// RetryIdempotent sends a request again after its connection broke once it went out
	// (EOF, a reset) if it is idempotent by net/http's rule: its method is GET, HEAD,
	// OPTIONS or TRACE, or it has an Idempotency-Key or X-Idempotency-Key header; and its
	// body can be read again. Other requests are never sent again once they may have gone
	// out.
	RetryIdempotent bool
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
	rt, err := t.Router.newRetrier(req.Context(), key, write)
	if err != nil {
		return nil, err
	}
	for {
		resp, tr := t.try(req, base, key, write)
		again, end := rt.after(req.Context(), tr)
		switch {
		case again:
		case end != nil:
			return nil, end
		case tr.err != nil:
			return nil, tr.err
		default:
			return resp, nil
		}
	}
}

// try sends req once, to the replica of key. A response it is to be tried again after (421)
// it drains and closes, and returns nil for.
func (t *Transport) try(req *http.Request, base http.RoundTripper, key []byte, write bool) (*http.Response, try) {
	route, rep, l, err := t.Router.pickFor(key, write)
	tr := try{route: route, to: rep}
	switch {
	case errors.Is(err, ErrQuarantined):
		tr.err = err
		return nil, tr
	case err != nil:
		tr.cause, tr.err = retryNotSent, err
		return nil, tr
	case rep.Address == "":
		tr.cause, tr.err = retryNotSent, fmt.Errorf("client: node %s's address is not known yet", rep.ID)
		return nil, tr
	}
	// A try that never had a connection when the call ended was not sent, whatever net/http
	// answers (the context's error, as for a replica that did not answer).
	var connected atomic.Bool
	traced := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	out := req.Clone(traced)
	out.URL.Host, out.Host = rep.Address, ""
	if gen, ok := t.Router.freshGeneration(); ok {
		out.Header.Set(MapGenerationHeader, strconv.FormatUint(gen, 10))
	}
	if req.GetBody != nil && req.Body != nil && req.Body != http.NoBody {
		if out.Body, err = req.GetBody(); err != nil {
			tr.err = fmt.Errorf("client: reading the request's body again: %w", err)
			return nil, tr
		}
	}
	l.n.Add(1)
	resp, err := base.RoundTrip(out)
	l.n.Add(-1)
	tr.cause, tr.err = t.causeOf(req, resp, err), err
	if tr.cause == noRetry && err != nil && !connected.Load() && req.Context().Err() != nil {
		tr.cause = retryNotSent
	}
	if tr.cause != retryNotOwner {
		return resp, tr
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // drained for the connection's reuse
	resp.Body.Close()
	tr.err = fmt.Errorf("%s answered %s", rep.ID, resp.Status)
	return nil, tr
}

// causeOf returns why a request that ended with resp and err is tried again, if it is.
func (t *Transport) causeOf(req *http.Request, resp *http.Response, err error) retryCause {
	rereadable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	switch {
	case !rereadable:
		return noRetry
	case err == nil && resp.StatusCode == http.StatusMisdirectedRequest:
		return retryNotOwner
	case err == nil:
		return noRetry
	case dialFailed(err):
		return retryNotSent
	case t.RetryIdempotent && idempotent(req) && connBroke(err):
		return retryBroken
	}
	return noRetry
}

// dialFailed reports whether err is a failure to connect: the request was not sent.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// idempotent reports whether req may be sent twice, by net/http's rule (Request.isReplayable,
// less its body, which causeOf checks).
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// connBroke reports whether err says the connection broke once the request may have gone
// out, before an answer came; not a timeout, which may have been the answer's slowness.
func connBroke(err error) bool {
	var op *net.OpError
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE):
		return true
	case errors.As(err, &op):
		return !op.Timeout() && (op.Op == "read" || op.Op == "write")
	}
	return false
}
