package kvclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"

	"github.com/sliceplane/sliceplane/client"
)

// ErrNoAddress is returned by Read when the router knows a replica but not yet its address.
var ErrNoAddress = errors.New("kvclient: no address known for the node")

// ErrNoAnswer is returned by Fetch when no replica answered: every one it tried failed, was
// beyond its freshness bound, or said the key is not its own.
var ErrNoAnswer = errors.New("kvclient: no replica answered")

// Router is what a read needs of a router; *client.Router has it.
type Router interface {
	Pick(key []byte) (client.Replica, error)
	Lookup(key []byte) (client.Route, error)
	Begin(nodeID string) (done func())
}

var _ Router = (*client.Router)(nil)

// maxTries bounds the requests of one read. A slice has a few replicas; the bound is for
// owners named by misdirected answers, which a router a step behind the nodes follows.
const maxTries = 8

// Pool keeps one client per node address, for routers that read from every node.
type Pool struct {
	http  *http.Client
	mu    sync.Mutex
	nodes map[string]*Node
}

// NewPool returns an empty pool whose clients use hc (nil: http.DefaultClient).
func NewPool(hc *http.Client) *Pool { return &Pool{http: hc, nodes: map[string]*Node{}} }

// Node returns the client of the node at addr, making it at first use.
func (p *Pool) Node(addr string) *Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.nodes[addr]
	if !ok {
		n = New(addr, p.http)
		p.nodes[addr] = n
	}
	return n
}

// Result is how a read went. Misdirected, Stale and Errors count the replicas that did not
// answer on the way, whether or not another one did then.
type Result struct {
	Value []byte
	// Clock is the source clock the answering node's data reflects.
	Clock uint64
	// Served is the replica that answered, or the last one tried.
	Served client.Replica
	// Tries is the number of replicas tried.
	Tries int
	// Misdirected counts 421 answers (the key is not the node's), Stale 503 answers giving
	// BeyondFreshness, and Errors the other failures: no address known, no connection, a
	// timeout, an unexpected status.
	Misdirected, Stale, Errors int
}

// Fetch reads key from the replicas of its slice until one answers, with the value or with
// ErrNotFound: first the replica the router's policy picks, then the owners that a
// misdirected answer names (the router may be a step behind the map), then the slice's other
// replicas in the router's map, each once. Every request is reported to the router
// (Begin/done) for the policies that count requests in flight. When none answers the error
// is ErrNoAnswer, wrapping the last failure; before the router's first map,
// client.ErrNotReady; when ctx ends, ctx's error.
func (p *Pool) Fetch(ctx context.Context, router Router, key []byte) (Result, error) {
	var res Result
	first, err := router.Pick(key)
	if err != nil {
		return res, err
	}
	queue := []client.Replica{first}
	if route, err := router.Lookup(key); err == nil {
		for _, r := range route.Replicas {
			if r.ID != first.ID {
				queue = append(queue, r)
			}
		}
	}
	var tried []string
	var last error
	for len(queue) > 0 && res.Tries < maxTries {
		rep := queue[0]
		queue = queue[1:]
		if slices.Contains(tried, rep.ID) {
			continue
		}
		tried = append(tried, rep.ID)
		res.Served = rep
		res.Tries++
		value, clock, err := p.try(ctx, router, rep, key)
		if err == nil || errors.Is(err, ErrNotFound) {
			res.Value, res.Clock = value, clock
			return res, err
		}
		if ctx.Err() != nil {
			return res, fmt.Errorf("kvclient: reading %q: %w", key, ctx.Err())
		}
		last = err
		var nm *NotMineError
		var stale *StaleError
		switch {
		case errors.As(err, &nm):
			res.Misdirected++
			var owners []client.Replica
			for _, o := range nm.Owners {
				owners = append(owners, client.Replica{ID: o.ID, Address: o.Address})
			}
			queue = append(owners, queue...)
		case errors.As(err, &stale):
			res.Stale++
		default:
			res.Errors++
		}
	}
	return res, fmt.Errorf("%w: %d tried, the last: %w", ErrNoAnswer, res.Tries, last)
}

// try sends one read to rep.
func (p *Pool) try(ctx context.Context, router Router, rep client.Replica, key []byte) ([]byte, uint64, error) {
	if rep.Address == "" {
		return nil, 0, fmt.Errorf("%w: %s", ErrNoAddress, rep.ID)
	}
	done := router.Begin(rep.ID)
	defer done()
	return p.Node(rep.Address).Get(ctx, key)
}

// Read is Fetch for callers that need only the answer: served is the replica that answered
// (or the last one tried), and redirected says whether any replica said the key was not
// its own.
func (p *Pool) Read(ctx context.Context, router Router, key []byte) (value []byte, clock uint64, served client.Replica, redirected bool, err error) {
	res, err := p.Fetch(ctx, router, key)
	return res.Value, res.Clock, res.Served, res.Misdirected > 0, err
}
