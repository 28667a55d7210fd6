package kvnode_test

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/source/sourcetest"
)

// TestALoadingNodeSendsReadsToTheServingReplicas gives a node a slice whose scan the source
// holds: a read of a key of that slice is answered 421 naming the replica that has the data,
// never 404, until the scan is done and the node serves the key itself.
func TestALoadingNodeSendsReadsToTheServingReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gs := &sourcetest.Gated{}
	c := clustertest.New(t, clustertest.Options{Distributor: func(cfg *distributor.Config) { cfg.Source = gs }})
	gs.Source = c.Source
	c.StartDistributor("d1")
	k1 := startNode(t, c, "k1")
	key := []byte("key-loading")
	if _, err := writer.New(etcdtest.Client(t, c.Etcd), writer.DefaultPrefix).Put(ctx, key, []byte("v")); err != nil {
		t.Fatal(err)
	}
	getValue := func(n *kvclient.Node) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			v, _, err := n.Get(ctx, key)
			if err == nil && string(v) != "v" {
				err = errors.New("value " + string(v))
			}
			return err
		}
	}
	if err := launch.WaitFor(ctx, "k1 serves the key", 20*time.Millisecond, getValue(k1)); err != nil {
		t.Fatal(err)
	}
	admin := pb.NewAdminServiceClient(c.Conn())
	if _, err := admin.Freeze(ctx, &pb.FreezeRequest{Reason: "test"}); err != nil {
		t.Fatal(err)
	}

	gs.Shut()
	k2 := startNode(t, c, "k2")
	err := launch.WaitFor(ctx, "k2 a replica of the key's slice", 20*time.Millisecond, func(ctx context.Context) error {
		_, err := admin.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}, To: []string{"k1", "k2"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = launch.WaitFor(ctx, "k2 holds the key's slice", 20*time.Millisecond, func(ctx context.Context) error {
		held, err := k2.Slices(ctx)
		if err != nil {
			return err
		}
		for _, r := range held {
			if r.Contains(client.Hash(key)) {
				return nil
			}
		}
		return errors.New("not yet")
	})
	if err != nil {
		t.Fatal(err)
	}
	err = launch.WaitFor(ctx, "the slice's scan held", 20*time.Millisecond, func(context.Context) error {
		if gs.Waiting() == 0 {
			return errors.New("no scan is held")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = k2.Get(ctx, key)
	var nm *kvclient.NotMineError
	switch {
	case errors.As(err, &nm):
		if len(nm.Owners) != 1 || nm.Owners[0].ID != "k1" {
			t.Fatalf("a loading node names %v, want k1 only", nm.Owners)
		}
	case errors.Is(err, kvclient.ErrNotFound):
		t.Fatal("a node loading the key's slice answered 404")
	default:
		t.Fatalf("a read from a loading node: %v, want a 421", err)
	}

	gs.Open()
	if err := launch.WaitFor(ctx, "k2 serves the key", 20*time.Millisecond, getValue(k2)); err != nil {
		t.Fatal(err)
	}
}
