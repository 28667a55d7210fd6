package client_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
)

// TestADrainWithNoAssignerRunningEndsAtOnce drains a node while nothing listens at any of
// its assigners' addresses: with nowhere to hand its slices to, the drain ends at once with
// ErrNowhereToDrain rather than wait for an assigner until its context ends.
func TestADrainWithNoAssignerRunningEndsAtOnce(t *testing.T) {
	n, err := client.NewNode(client.NodeConfig{ID: "n1", Assigners: []string{deadAddress(t), deadAddress(t)}, Address: "127.0.0.1:2",
		Store: memstore.New(), Logger: quiet()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := runNode(ctx, n)
	dctx, dcancel := context.WithTimeout(t.Context(), time.Minute)
	defer dcancel()
	start := time.Now()
	err = n.Drain(dctx)
	took := time.Since(start)
	require.ErrorIs(t, err, client.ErrNowhereToDrain)
	assert.Less(t, took, 2*time.Second, "the drain ends at once")
	t.Logf("the drain ended in %s: %v", took.Round(time.Millisecond), err)
	cancel()
	require.NoError(t, <-done)
}

// TestADrainWaitsForAnAssignerThatListens drains a node whose assigner accepts connections
// but never answers (one that hangs): that is no proof that no assigner runs, and the drain
// waits for it until its context ends.
func TestADrainWaitsForAnAssignerThatListens(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer lis.Close()
	n, err := client.NewNode(client.NodeConfig{ID: "n1", Assigners: []string{lis.Addr().String(), deadAddress(t)}, Address: "127.0.0.1:2",
		Store: memstore.New(), Logger: quiet()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := runNode(ctx, n)
	dctx, dcancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer dcancel()
	err = n.Drain(dctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, client.ErrNowhereToDrain)
	cancel()
	require.NoError(t, <-done)
}
