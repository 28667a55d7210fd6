package converge_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/converge"
)

// slowCluster is the fixture's cluster whose nodes reach the fence only after behind calls.
type slowCluster struct {
	f              *fixture
	behind         int
	fences, visits int
}

func (c *slowCluster) Fence(context.Context) (uint64, error) {
	c.fences++
	return c.f.at, nil // the nodes hold the source as of at: the fence a writer would get there
}

func (c *slowCluster) Map(context.Context) (*assignment.Assignment, error) { return c.f.a, nil }

func (c *slowCluster) Nodes(context.Context) (map[assignment.NodeID]converge.Node, error) {
	c.visits++
	clock := c.f.at
	if c.visits <= c.behind {
		clock--
	}
	out := map[assignment.NodeID]converge.Node{}
	for id, s := range c.f.nodes {
		out[id] = converge.Node{Clock: clock, Reader: s}
	}
	return out, nil
}

func TestWaitKeepsItsFenceUntilTheNodesReachIt(t *testing.T) {
	f := newFixture(t)
	c := &slowCluster{f: f, behind: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := converge.Wait(ctx, f.src, c, time.Millisecond)
	require.NoError(t, err)
	require.True(t, r.OK(), "%s", r)
	require.Equal(t, 4, c.visits, "three attempts found the nodes behind, the fourth checked")
	require.Equal(t, 1, c.fences, "one fence, waited on until reached")
}

func TestWaitSaysWhyItGaveUp(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := converge.Wait(ctx, f.src, &slowCluster{f: f, behind: 1 << 30}, time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "nodes have not reached clock")
}
