// Package kvclienttest fakes nodes of the example key-value store, and a router over them,
// for tests of what reads through kvclient.Pool: each fake node answers every read as told
// (the value, not found, not mine, beyond its freshness bound, an error, or no answer at all).
package kvclienttest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
)

// Answer is how a fake node answers a read.
type Answer int

// The answers of a fake node.
const (
	// Value answers 200 with Value(key).
	Value Answer = iota
	// NotFound answers 404: the key is the node's and it does not hold it.
	NotFound
	// NotMine answers 421 naming the node's owners (SetOwners).
	NotMine
	// Stale answers 503 giving kvclient.BeyondFreshness as its reason.
	Stale
	// Unavailable answers 503 for another reason.
	Unavailable
	// Fail answers 500.
	Fail
	// Hang answers nothing until the client gives up (its timeout or context).
	Hang
)

// ValueOf returns the value a fake node answers for key.
func ValueOf(key string) string { return "value of " + key }

// Node is a fake node serving the read API on loopback.
type Node struct {
	ID  string
	srv *httptest.Server

	mu       sync.Mutex
	answer   Answer
	byKey    map[string]Answer
	owners   []kvclient.Owner
	requests int
	gate     <-chan struct{}
	waiting  chan struct{}
}

// NewNode starts a fake node answering every read with a; the test's cleanup stops it.
func NewNode(t testing.TB, id string, a Answer) *Node {
	n := &Node{ID: id, answer: a, byKey: map[string]Answer{}, waiting: make(chan struct{}, 64)}
	n.srv = httptest.NewServer(http.HandlerFunc(n.serve))
	t.Cleanup(n.srv.Close)
	return n
}

// Set makes the node answer every read with a, but for the keys given an answer of their own.
func (n *Node) Set(a Answer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.answer = a
}

// SetKey makes the node answer reads of key with a.
func (n *Node) SetKey(key string, a Answer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.byKey[key] = a
}

// SetOwners sets the owners that NotMine answers name.
func (n *Node) SetOwners(owners ...*Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.owners = n.owners[:0]
	for _, o := range owners {
		n.owners = append(n.owners, kvclient.Owner{ID: o.ID, Address: o.Address()})
	}
}

// Requests returns the number of reads the node was sent.
func (n *Node) Requests() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.requests
}

// HoldUntil makes every read wait until gate is closed (or the client gives up) before it
// is answered; nil answers at once.
func (n *Node) HoldUntil(gate <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gate = gate
}

// Waiting receives a value each time a read starts to wait: held (HoldUntil) or hanging
// (Hang). It keeps up to 64 not received.
func (n *Node) Waiting() <-chan struct{} { return n.waiting }

// wait signals that a read waits, and waits for gate or the read's end.
func (n *Node) wait(r *http.Request, gate <-chan struct{}) {
	select {
	case n.waiting <- struct{}{}:
	default:
	}
	select {
	case <-gate:
	case <-r.Context().Done():
	}
}

// Address is the node's address, as a router gives it.
func (n *Node) Address() string { return n.srv.Listener.Addr().String() }

// Replica returns the node as a router's replica.
func (n *Node) Replica() client.Replica {
	return client.Replica{ID: n.ID, Address: n.Address(), Capacity: 1}
}

func (n *Node) serve(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Path[len(kvclient.KeyPath):]
	n.mu.Lock()
	n.requests++
	a, ok := n.byKey[key]
	if !ok {
		a = n.answer
	}
	owners := append([]kvclient.Owner{}, n.owners...)
	gate := n.gate
	n.mu.Unlock()
	if gate != nil {
		n.wait(r, gate)
	}
	switch a {
	case Value:
		w.Header().Set(kvclient.ClockHeader, "7")
		w.Write([]byte(ValueOf(key))) //nolint:errcheck // the client went away
	case NotFound:
		http.Error(w, "fake: no such key", http.StatusNotFound)
	case NotMine:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMisdirectedRequest)
		json.NewEncoder(w).Encode(kvclient.Misdirected{Error: "not mine", Owners: owners}) //nolint:errcheck // the client went away
	case Stale:
		http.Error(w, "fake: "+kvclient.BeyondFreshness+": no word from the distributor for 12s", http.StatusServiceUnavailable)
	case Unavailable:
		http.Error(w, "fake: shutting down", http.StatusServiceUnavailable)
	case Fail:
		http.Error(w, "fake: the store failed", http.StatusInternalServerError)
	case Hang:
		n.wait(r, nil)
	}
}

// Router routes every key to one slice held by Replicas; Pick returns Replicas[First].
// It counts the requests in flight that reads report (Begin).
type Router struct {
	Replicas []client.Replica
	First    int

	mu       sync.Mutex
	inFlight int
	begun    int
}

// NewRouter returns a router over nodes, picking the first.
func NewRouter(nodes ...*Node) *Router {
	r := &Router{}
	for _, n := range nodes {
		r.Replicas = append(r.Replicas, n.Replica())
	}
	return r
}

// Pick returns Replicas[First], or client.ErrNotReady if there are none.
func (r *Router) Pick([]byte) (client.Replica, error) {
	if len(r.Replicas) == 0 {
		return client.Replica{}, client.ErrNotReady
	}
	return r.Replicas[r.First], nil
}

// Lookup returns the one slice.
func (r *Router) Lookup(key []byte) (client.Route, error) {
	if len(r.Replicas) == 0 {
		return client.Route{}, client.ErrNotReady
	}
	return client.Route{Hash: client.Hash(key), Slice: client.FullRange(), Replicas: r.Replicas, Generation: 1}, nil
}

// Begin counts a request in flight.
func (r *Router) Begin(string) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inFlight++
	r.begun++
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.inFlight--
		})
	}
}

// Requests returns the requests begun and those still in flight.
func (r *Router) Requests() (begun, inFlight int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.begun, r.inFlight
}

var _ kvclient.Router = (*Router)(nil)
