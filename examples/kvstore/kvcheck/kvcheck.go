// Package kvcheck checks a running example key-value store from outside: it asks each node
// over HTTP what it holds and compares that with the data source and the assigner's map
// (internal/converge), the way an operator would after a failure.
package kvcheck

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
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
	// Source is the cluster's data source; Put is used to write the fence.
	Source *source.Etcd
	// Assigner is a connection to the leading assigner (internal/dial.Leader).
	Assigner grpc.ClientConnInterface
	// Nodes are the nodes' HTTP clients.
	Nodes []*kvclient.Node
	// Poll is the time between attempts; default 200 ms.
	Poll time.Duration
}

// Wait waits until the nodes hold exactly what they must, or ctx ends; it returns the last
// report. Writers should have stopped and the map should be still for the wait to end, as
// each check is against one map. A node in the map that no given node answers for, or one
// that cannot be reached, counts as not converged, and the wait goes on.
//
// Each attempt writes a fence item and waits for every node to apply its clock: a node's
// clock covers a change only after the quanta before it, so the node has then applied the
// map of the check too.
func (c *Checker) Wait(ctx context.Context) (converge.Report, error) {
	poll := c.Poll
	if poll == 0 {
		poll = 200 * time.Millisecond
	}
	var last converge.Report
	var lastErr error
	var fence uint64
	for {
		r, err := c.check(ctx, &fence)
		switch {
		case err == nil && r.OK():
			return r, nil
		case err == nil:
			last, lastErr = r, nil
		case ctx.Err() == nil:
			lastErr = err
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			if lastErr != nil {
				return last, fmt.Errorf("kvcheck: not converged: %w (last attempt: %v)", ctx.Err(), lastErr)
			}
			return last, fmt.Errorf("kvcheck: not converged: %w\n%s", ctx.Err(), last)
		}
	}
}

// check makes one attempt. It writes a new fence when *fence is 0, and clears *fence once
// the nodes have reached it, so that the next attempt starts afresh; an attempt that finds
// nodes behind leaves the fence for the next one to wait on.
func (c *Checker) check(ctx context.Context, fence *uint64) (converge.Report, error) {
	if *fence == 0 {
		f, err := c.Source.Put(ctx, FenceKey, []byte(time.Now().UTC().Format(time.RFC3339Nano)))
		if err != nil {
			return converge.Report{}, fmt.Errorf("kvcheck: writing the fence: %w", err)
		}
		*fence = f
	}
	resp, err := pb.NewAssignmentServiceClient(c.Assigner).GetAssignment(ctx, &pb.GetAssignmentRequest{})
	if err != nil {
		return converge.Report{}, fmt.Errorf("kvcheck: getting the map: %w", err)
	}
	a, err := wire.AssignmentFromProto(resp.GetAssignment())
	if err != nil {
		return converge.Report{}, fmt.Errorf("kvcheck: the map: %w", err)
	}
	readers := map[assignment.NodeID]client.Reader{}
	var behind []string
	for _, n := range c.Nodes {
		st, err := n.State(ctx)
		if err != nil {
			return converge.Report{}, err
		}
		if st.Clock < *fence {
			behind = append(behind, fmt.Sprintf("%s at %d", st.ID, st.Clock))
		}
		readers[assignment.NodeID(st.ID)] = kvclient.Reader{Node: n}
	}
	if len(behind) > 0 {
		slices.Sort(behind)
		return converge.Report{}, fmt.Errorf("kvcheck: nodes have not reached clock %d: %v", *fence, behind)
	}
	at := *fence
	*fence = 0
	return converge.Check(ctx, c.Source, at, a, readers)
}

// Items counts the items of the source, the fence excluded.
func Items(ctx context.Context, src source.Source) (int, error) {
	clock, err := src.Clock(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	err = src.Scan(ctx, keyspace.Full(), clock, func(it source.Item) error {
		if string(it.Key) != string(FenceKey) {
			n++
		}
		return nil
	})
	return n, err
}
