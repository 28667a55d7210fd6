package client_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/clustertest"
)

// A storage node embeds a Node: it joins the cluster, and its Store receives the node's
// slices and the items written in them.
func ExampleNode() {
	sp := startExample() // a running Sliceplane: an assigner, a distributor and its etcd
	defer sp.close()

	store := memstore.New()
	node, err := client.NewNode(client.NodeConfig{
		ID:        "n1",
		Address:   "127.0.0.1:9001", // where routers send the requests for n1's keys
		Assigners: sp.assigners,
		Store:     store,
		Logger:    slog.New(slog.DiscardHandler), // quiet for the example; default slog.Default()
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- node.Run(ctx) }()

	// The application writes to the source of truth; the write reaches the node.
	if _, err := sp.writer.Put(ctx, []byte("k1"), []byte("hello")); err != nil {
		log.Fatal(err)
	}
	// A node serves what its store holds as it arrives; the example waits for the item.
	eventually(func() bool {
		_, ok, _ := store.Get(ctx, []byte("k1"))
		return ok && share(node.Slices()) == 100
	})
	item, _, err := store.Get(ctx, []byte("k1"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("node n1 serves %d%% of the key space\n", share(node.Slices()))
	fmt.Printf("k1 = %s\n", item.Value)

	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// node n1 serves 100% of the key space
	// k1 = hello
}

// A proxy embeds a Router to find the nodes that hold a key, and to pick one of them for
// each request.
func ExampleRouter() {
	sp := startExample("n1") // a running Sliceplane with one storage node, n1
	defer sp.close()

	r, err := client.NewRouter(client.RouterConfig{Assigners: sp.assigners, Policy: client.LeastOutstanding})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if err := r.WaitReady(ctx); err != nil {
		log.Fatal(err)
	}
	waitPlaced(r, "user:42") // the map gives n1 its slices once the assigner has seen it

	route, err := r.Lookup([]byte("user:42"))
	if err != nil {
		log.Fatal(err)
	}
	for _, rep := range route.Replicas {
		fmt.Printf("key user:42 -> %s\n", rep.ID)
	}

	// For each request: pick a replica, and tell the router while the request is out.
	replica, err := r.Pick([]byte("user:42"))
	if err != nil {
		log.Fatal(err)
	}
	finished := r.Begin(replica.ID)
	fmt.Printf("send the request to %s\n", replica.ID)
	finished()

	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// key user:42 -> n1
	// send the request to n1
}

// A service that keeps its own state per key (here a cache filled from its own backend)
// embeds a Member: the map tells it which ranges it owns, through the Application it
// implements, and the member tells the assigner once a range is loaded.
func ExampleMember() {
	sp := startExample() // a running Sliceplane: an assigner and its etcd (no data path is needed)
	defer sp.close()

	cache := &cacheApp{}
	m, err := client.NewMember(client.MemberConfig{
		ID:        "cache-1",
		Address:   "127.0.0.1:9101", // where routers send the requests for its keys
		Assigners: sp.assigners,
		App:       cache,
		Logger:    slog.New(slog.DiscardHandler), // quiet for the example; default slog.Default()
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	// Once the member's acquire returned, it serves the keys of the ranges it owns.
	eventually(func() bool { return m.Serving([]byte("user:42")) })
	fmt.Printf("cache-1 owns %d%% of the key space: %s\n", share(cache.owned()), cache.owned()[0])
	m.RecordLoad([]byte("user:42"), 1) // each request served, for the balancer

	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// cache-1 owns 100% of the key space: [0x0000000000000000, end)
}

// cacheApp is the Application of ExampleMember: it keeps the ranges it was given.
type cacheApp struct {
	mu     sync.Mutex
	ranges []client.Range
}

func (a *cacheApp) Acquire(ctx context.Context, r client.Range, g client.Grant) error {
	// Load what serving r takes (warm the cache from the backend), then say so.
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ranges = append(a.ranges, r)
	return nil
}

func (a *cacheApp) Release(ctx context.Context, r client.Range) error {
	// Drop what it holds of r; a release may cover part of a range acquired before.
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ranges = slices.DeleteFunc(a.ranges, func(h client.Range) bool { return h == r })
	return nil
}

func (a *cacheApp) ChangeRole(ctx context.Context, r client.Range, g client.Grant) error {
	return nil
}

func (a *cacheApp) owned() []client.Range {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.ranges)
}

// The two halves of the hash space, and where a key falls.
func ExampleRange() {
	lower := client.Range{Start: 0, End: client.BoundAt(1 << 63)}
	upper := client.Range{Start: 1 << 63, End: client.EndOfSpace()}
	fmt.Println(lower, upper)
	fmt.Println(lower.Fraction(), lower.Overlaps(upper))
	fmt.Println(lower.ContainsKey([]byte("user:42")), upper.ContainsKey([]byte("user:42")))
	// Output:
	// [0x0000000000000000, 0x8000000000000000) [0x8000000000000000, end)
	// 0.5 false
	// false true
}

// example is a Sliceplane running in the process for the examples.
type example struct {
	c         *clustertest.Cluster
	assigners []string
	etcd      *clientv3.Client
	writer    *writer.Writer
}

// startExample starts an etcd, an assigner and a distributor, and the storage nodes named,
// each on a store of its own.
func startExample(nodes ...string) *example {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := clustertest.Start(ctx, clustertest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	c.StartDistributor("d1")
	for _, id := range nodes {
		c.StartNode(id, nil)
	}
	cli, err := writer.Dial([]string{c.Etcd.Endpoint()}, client.TLS{})
	if err != nil {
		log.Fatal(err)
	}
	return &example{c: c, assigners: c.Assigners(), etcd: cli, writer: writer.New(cli, writer.DefaultPrefix)}
}

func (e *example) close() {
	e.etcd.Close()
	if err := e.c.Close(); err != nil {
		log.Fatal(err)
	}
}

// waitPlaced waits until the router's map gives key's slice a replica.
func waitPlaced(r *client.Router, key string) {
	eventually(func() bool {
		rt, err := r.Lookup([]byte(key))
		return err == nil && len(rt.Replicas) > 0
	})
}

// eventually waits until cond holds, and gives up after a minute.
func eventually(cond func() bool) {
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			log.Fatal("example: the cluster did not get there within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// share returns the percentage of the key space that rs cover, rounded.
func share(rs []client.Range) int {
	var sum float64
	for _, r := range rs {
		sum += r.Fraction()
	}
	return int(math.Round(100 * sum))
}
