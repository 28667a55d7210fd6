package kvnode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvnode"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// TestANodeDrainsWhenItStops stops a node that holds slices, as SIGTERM does: it hands
// them off to the other node before Run returns, and leaves the assigner's nodes.
func TestANodeDrainsWhenItStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := clustertest.New(t, clustertest.Options{})
	c.StartDistributor("d1")
	srv, err := kvnode.New(kvnode.Config{ID: "k1", Listen: "127.0.0.1:0", Assigners: c.Assigners(), DataDir: t.TempDir(),
		ReportInterval: 100 * time.Millisecond, DrainTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	stopped := false
	defer func() {
		if !stopped { // the test failed before stopping k1
			stop()
			<-done
		}
	}()
	holders := func(ctx context.Context) (map[assignment.NodeID]bool, error) {
		a, _, err := c.Assignment(ctx)
		if err != nil {
			return nil, err
		}
		held := map[assignment.NodeID]bool{}
		for _, s := range a.All() {
			for _, id := range s.Replicas {
				held[id] = true
			}
		}
		return held, nil
	}
	err = launch.WaitFor(ctx, "k1 holds slices", 50*time.Millisecond, func(ctx context.Context) error {
		held, err := holders(ctx)
		if err == nil && !held["k1"] {
			err = fmt.Errorf("k1 holds no slice: %v", held)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	startNode(t, c, "k2")
	admin := pb.NewAdminServiceClient(c.Conn())
	err = launch.WaitFor(ctx, "k2 registered", 50*time.Millisecond, func(ctx context.Context) error {
		nodes, err := admin.ListNodes(ctx, &pb.ListNodesRequest{})
		if err == nil && len(nodes.GetNodes()) != 2 {
			err = fmt.Errorf("%d nodes registered", len(nodes.GetNodes()))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	stop()
	stopped = true
	if err := <-done; err != nil {
		t.Fatalf("k1 stopping: %v", err)
	}
	held, err := holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if held["k1"] || !held["k2"] {
		t.Fatalf("after k1 stopped, the holders are %v; want k2 alone", held)
	}
	nodes, err := admin.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.GetNodes() {
		if n.GetNode().GetId() == "k1" {
			t.Fatalf("k1 is still registered: %v", n)
		}
	}
}
