package assigner_test

import (
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
)

// TestBadClaimsAreRefusedOverGRPC checks the status codes an exclusive cluster's assigner
// answers a member's heartbeat with: a primary role the map gives another member, or no
// member, is FAILED_PRECONDITION; a token above the map's, INVALID_ARGUMENT; a heartbeat of
// a member that is not registered (a renewal of a lease it does not hold), NOT_FOUND. None
// renews the lease, and a good heartbeat does.
func TestBadClaimsAreRefusedOverGRPC(t *testing.T) {
	c := newCluster(t)
	a := c.start(func(cfg *assigner.Config) {
		cfg.Core.Roles, cfg.Core.Exclusive, cfg.Core.BreakBeforeMake = core.RolesPrimarySecondary, true, false
		// The first map waits for both members: made between their registrations, it gave
		// every primary to m1 (a failure of this test on a busy machine).
		cfg.Core.FirstMapNodes = 2
	})
	ctx := ctxT(t, 30*time.Second)
	a.leading(t)
	for _, id := range []string{"m1", "m2"} {
		reg, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: id}, Address: id + ":1", Roles: core.RolesPrimarySecondary})
		require.NoError(t, err)
		assert.Equal(t, 2*time.Second, reg.GetLease().AsDuration(), "a registration grants the first lease")
	}
	eventually(t, 10*time.Second, "every slice has a primary", func() bool {
		if !a.hasMap() {
			return false
		}
		m := a.assignment(t)
		for _, s := range m.All() {
			if s.Primary == "" {
				return false
			}
		}
		return m.Len() > 0
	})
	m := a.assignment(t)
	var mine, theirs *pb.Range
	var token uint64
	for _, s := range m.All() {
		r := &pb.Range{Start: s.Range.Start, End: s.Range.End.Point(), EndOfSpace: s.Range.End.IsEnd()}
		switch {
		case s.Primary == "m1" && mine == nil:
			mine, token = r, s.Token
		case s.Primary == "m2" && theirs == nil:
			theirs = r
		}
	}
	require.NotNil(t, mine)
	require.NotNil(t, theirs)
	for _, tc := range []struct {
		name string
		req  *pb.HeartbeatRequest
		code codes.Code
		msg  string
	}{
		{"another member's primary", &pb.HeartbeatRequest{NodeId: "m1", Primaries: []*pb.Range{theirs}, PrimaryTokens: []uint64{token}},
			codes.FailedPrecondition, "which the map gives to \"m2\""},
		{"a token from the future", &pb.HeartbeatRequest{NodeId: "m1", Primaries: []*pb.Range{mine}, PrimaryTokens: []uint64{token + 1000}},
			codes.InvalidArgument, "above the map's"},
		{"ranges without tokens", &pb.HeartbeatRequest{NodeId: "m1", Primaries: []*pb.Range{mine}},
			codes.InvalidArgument, "1 primary ranges but 0 tokens"},
		{"a lease the member does not hold", &pb.HeartbeatRequest{NodeId: "ghost"}, codes.NotFound, "register again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := a.nodes.Heartbeat(ctx, tc.req)
			require.Error(t, err)
			assert.Nil(t, resp.GetLease())
			assert.Equal(t, tc.code, code(err), "%v", err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
	resp, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "m1", Primaries: []*pb.Range{mine}, PrimaryTokens: []uint64{token}})
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, resp.GetLease().AsDuration(), "a good claim renews the lease")
}
