package kvclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/sliceplane/sliceplane/client"
)

// ErrNoAddress is returned by Read when the router knows a replica but not yet its address.
var ErrNoAddress = errors.New("kvclient: no address known for the node")

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

// Read reads key from the replica router picks, reporting the request to the router
// (Begin/done) for the policies that count requests in flight. A node that no longer owns
// the key (the router is a step behind the map) names the owners, and the read goes to the
// first of them once, if its address is known; redirected says so. served is the replica that answered last. Errors
// are Get's, client.ErrNotReady, or ErrNoAddress.
func (p *Pool) Read(ctx context.Context, router *client.Router, key []byte) (value []byte, clock uint64, served client.Replica, redirected bool, err error) {
	rep, err := router.Pick(key)
	if err != nil {
		return nil, 0, rep, false, err
	}
	for {
		if rep.Address == "" {
			return nil, 0, rep, redirected, fmt.Errorf("%w: %s", ErrNoAddress, rep.ID)
		}
		done := router.Begin(rep.ID)
		value, clock, err = p.Node(rep.Address).Get(ctx, key)
		done()
		var nm *NotMineError
		if redirected || !errors.As(err, &nm) || len(nm.Owners) == 0 || nm.Owners[0].Address == "" {
			return value, clock, rep, redirected, err
		}
		rep, redirected = client.Replica{ID: nm.Owners[0].ID, Address: nm.Owners[0].Address}, true
	}
}
