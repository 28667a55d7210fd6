// Package kvcheck checks a running example key-value store from outside: it asks each node
// over HTTP what it holds and compares that with the data source and the assigner's map
// (internal/converge), the way an operator would after a failure.
package kvcheck

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/converge"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// FenceKey is the item Wait writes to mark a clock every node must reach.
var FenceKey = []byte("kvcheck-fence")

// Checker checks one cluster.
type Checker struct {
	// Source is the cluster's data source; the fence is written through Put, unless it
	// is a source.Fencer.
	Source source.Writer
	// Assigner is a connection to the leading assigner (internal/dial.Leader).
	Assigner grpc.ClientConnInterface
	// Nodes are the nodes' HTTP clients.
	Nodes []*kvclient.Node
	// Poll is the time between attempts; default 200 ms.
	Poll time.Duration
}

// Wait waits until the nodes hold exactly what they must, or ctx ends; it returns the last
// report (converge.Wait). A node in the map that no given node answers for, or one that
// cannot be reached, counts as not converged, and the wait goes on.
func (c *Checker) Wait(ctx context.Context) (converge.Report, error) {
	poll := c.Poll
	if poll == 0 {
		poll = 200 * time.Millisecond
	}
	return converge.Wait(ctx, c.Source, cluster{c}, poll)
}

// cluster is what converge.Wait needs, reached as an operator would: the map from the
// assigner, the nodes over HTTP.
type cluster struct{ c *Checker }

// Fence writes the fence item, or, of a source that can fence without writing (a
// PostgreSQL table, which is an application's), takes its fence clock.
func (k cluster) Fence(ctx context.Context) (uint64, error) {
	if f, ok := k.c.Source.(source.Fencer); ok {
		return f.Fence(ctx)
	}
	return k.c.Source.Put(ctx, FenceKey, []byte(time.Now().UTC().Format(time.RFC3339Nano)))
}

func (k cluster) Map(ctx context.Context) (*assignment.Assignment, error) {
	resp, err := pb.NewAssignmentServiceClient(k.c.Assigner).GetAssignment(ctx, &pb.GetAssignmentRequest{})
	if err != nil {
		return nil, fmt.Errorf("kvcheck: getting the map: %w", err)
	}
	return wire.AssignmentFromProto(resp.GetAssignment())
}

func (k cluster) Nodes(ctx context.Context) (map[assignment.NodeID]converge.Node, error) {
	out := make(map[assignment.NodeID]converge.Node, len(k.c.Nodes))
	for _, n := range k.c.Nodes {
		st, err := n.State(ctx)
		if err != nil {
			return nil, err
		}
		out[assignment.NodeID(st.ID)] = converge.Node{Clock: st.Clock, Reader: kvclient.Reader{Node: n}}
	}
	return out, nil
}

// Items counts the items of the source, the fence excluded.
func Items(ctx context.Context, src source.Source) (int, error) {
	clock, err := src.Clock(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	_, err = src.Scan(ctx, keyspace.Full(), clock, func(it source.Item) error {
		if string(it.Key) != string(FenceKey) {
			n++
		}
		return nil
	})
	return n, err
}
