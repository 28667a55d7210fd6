package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// TestARequestWaitsForTheMapItWasRoutedBy asks a member's guards for a write of a point they
// do not serve as primary: refused at once when the caller said nothing of its map, or when
// the member's map is as new as the caller's; when the caller's map is newer, the request
// waits for the member's, and runs once that makes the point the member's.
func TestARequestWaitsForTheMapItWasRoutedBy(t *testing.T) {
	g := newGuards()
	all := keyspace.Full()
	g.publish([]served{{r: all, grant: Grant{Role: RoleSecondary}}}, 5)
	primary := func(gr Grant, held bool, _ uint64) (Grant, bool) { return gr, held && gr.Role == RolePrimary }
	h := uint64(1 << 60)

	_, ok := g.enter(context.Background(), h, true, primary)
	require.False(t, ok, "no caller's map: refused")
	_, ok = g.enter(context.WithValue(context.Background(), callerGeneration{}, uint64(5)), h, true, primary)
	require.False(t, ok, "the caller's map is no newer: refused")

	entered := make(chan bool, 1)
	go func() {
		_, ok := g.enter(context.WithValue(context.Background(), callerGeneration{}, uint64(7)), h, true, primary)
		entered <- ok
	}()
	g.publish([]served{{r: all, grant: Grant{Role: RoleSecondary}}}, 6) // still older: it waits on
	select {
	case <-entered:
		t.Fatal("the request did not wait for the caller's map")
	case <-time.After(50 * time.Millisecond):
	}
	g.publish([]served{{r: all, grant: Grant{Role: RolePrimary, Token: 7}}}, 7)
	select {
	case ok := <-entered:
		require.True(t, ok, "the map that made the point the member's let the request run")
	case <-time.After(10 * time.Second):
		t.Fatal("the request still waits")
	}
	g.leave(h, true)

	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), callerGeneration{}, uint64(9)), 20*time.Millisecond)
	defer cancel()
	g.publish([]served{{r: all, grant: Grant{Role: RoleSecondary}}}, 8)
	_, ok = g.enter(ctx, h, true, primary)
	require.False(t, ok, "refused once the request's context ended")
}
