package slicectl

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// TestSlicesShowHandoffs checks that the listing shows a handoff under way, in a column of
// its own that appears only while one is.
func TestSlicesShowHandoffs(t *testing.T) {
	resp := &pb.ListSlicesResponse{Total: 2, Slices: []*pb.SliceInfo{
		{Range: &pb.Range{Start: 0, End: 1 << 63}, Replicas: []string{"a"}},
		{Range: &pb.Range{Start: 1 << 63, EndOfSpace: true}, Replicas: []string{"a", "b"}, Loading: []string{"b"}, Leaving: []string{"a"}, Since: 12},
	}}
	var b bytes.Buffer
	require.NoError(t, printSlices(&session{out: newPrinter(&b, "table")}, resp, ""))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 4, b.String())
	assert.Equal(t, []string{"START", "END", "REPLICAS", "LOAD", "KEYS", "PINNED", "HANDOFF"}, strings.Fields(lines[0]))
	assert.True(t, strings.HasSuffix(lines[1], " -"), lines[1])
	assert.Contains(t, lines[2], "loading b, leaving a, since generation 12")

	b.Reset()
	resp.Slices[1].Loading = nil // b serves; a lingers
	require.NoError(t, printSlices(&session{out: newPrinter(&b, "table")}, resp, ""))
	assert.Contains(t, b.String(), "loaded; a lingers, then drops it (since generation 12)")

	b.Reset()
	resp.Slices = resp.Slices[:1]
	require.NoError(t, printSlices(&session{out: newPrinter(&b, "table")}, resp, ""))
	assert.NotContains(t, b.String(), "HANDOFF", "no column while no handoff is under way")
}

// TestStatusCountsHandoffs checks that status shows the slices in handoff, in the table
// only while there are some, and always in JSON.
func TestStatusCountsHandoffs(t *testing.T) {
	st := &pb.StatusResponse{Leader: true, LeaderAddress: "a:1", Slices: 10, Nodes: 2, Handoffs: 3}
	var b bytes.Buffer
	require.NoError(t, printStatus(&session{out: newPrinter(&b, "table")}, st))
	assert.Contains(t, b.String(), "3 slices moving (loading on their new nodes, or served by both while the old ones linger)")
	assert.Equal(t, uint32(3), statusJSON(st).Handoffs)

	b.Reset()
	st.Handoffs = 0
	require.NoError(t, printStatus(&session{out: newPrinter(&b, "table")}, st))
	assert.NotContains(t, b.String(), "handoffs")
}
