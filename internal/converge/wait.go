package converge

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/source"
)

// Cluster is what Wait needs of a running cluster, however it is reached (in-process nodes,
// nodes over HTTP).
type Cluster interface {
	// Fence writes an item to the source and returns the clock of the write.
	Fence(ctx context.Context) (uint64, error)
	// Map returns the assignment to check against.
	Map(ctx context.Context) (*assignment.Assignment, error)
	// Nodes returns the nodes to check, by ID.
	Nodes(ctx context.Context) (map[assignment.NodeID]Node, error)
}

// Node is one node as Wait sees it: the source clock it has applied and what it holds.
type Node struct {
	Clock  uint64
	Reader client.Reader
}

// Wait waits until the nodes hold exactly what they must (Check), or ctx ends; it returns the
// last report. Writers should have stopped and the map should be still for the wait to end,
// as each check is against one map; a failed attempt (a node that cannot be reached) is
// retried every poll.
//
// Each attempt writes a fence item and waits for every node to apply its clock: a node's
// clock covers a change only after the quanta before it, so the node has then applied the
// map of the check too.
func Wait(ctx context.Context, src source.Source, c Cluster, poll time.Duration) (Report, error) {
	var last Report
	var lastErr error
	var fence uint64
	t := time.NewTimer(poll)
	defer t.Stop()
	for {
		r, err := attempt(ctx, src, c, &fence)
		switch {
		case err == nil && r.OK():
			return r, nil
		case err == nil:
			last, lastErr = r, nil
		case ctx.Err() == nil:
			lastErr = err
		}
		t.Reset(poll)
		select {
		case <-t.C:
		case <-ctx.Done():
			if lastErr != nil {
				return last, fmt.Errorf("converge: not converged: %w (last attempt: %v)", ctx.Err(), lastErr)
			}
			return last, fmt.Errorf("converge: not converged: %w\n%s", ctx.Err(), last)
		}
	}
}

// attempt makes one check. It writes a new fence when *fence is 0, and clears *fence once
// the nodes have reached it, so that the next attempt starts afresh; an attempt that finds
// nodes behind leaves the fence for the next one to wait on.
func attempt(ctx context.Context, src source.Source, c Cluster, fence *uint64) (Report, error) {
	if *fence == 0 {
		f, err := c.Fence(ctx)
		if err != nil {
			return Report{}, fmt.Errorf("converge: writing the fence: %w", err)
		}
		*fence = f
	}
	a, err := c.Map(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("converge: the map: %w", err)
	}
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("converge: the nodes: %w", err)
	}
	readers := make(map[assignment.NodeID]client.Reader, len(nodes))
	var behind []string
	for id, n := range nodes {
		if n.Clock < *fence {
			behind = append(behind, fmt.Sprintf("%s at %d", id, n.Clock))
		}
		readers[id] = n.Reader
	}
	if len(behind) > 0 {
		slices.Sort(behind)
		return Report{}, fmt.Errorf("converge: nodes have not reached clock %d: %v", *fence, behind)
	}
	at := *fence
	*fence = 0
	return Check(ctx, src, at, a, readers)
}
