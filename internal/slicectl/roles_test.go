package slicectl

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// TestSlicesShowPrimaries checks that the listing names each slice's primary, and a
// handover under way, and its grant's fencing token, in a column that appears only in a cluster with roles.
func TestSlicesShowPrimaries(t *testing.T) {
	resp := &pb.ListSlicesResponse{Total: 2, Slices: []*pb.SliceInfo{
		{Range: &pb.Range{Start: 0, End: 1 << 63}, Replicas: []string{"a", "b"}, Primary: "a"},
		{Range: &pb.Range{Start: 1 << 63, EndOfSpace: true}, Replicas: []string{"a", "b"}, Primary: "b", Next: "a", Token: 9},
	}}
	var b bytes.Buffer
	require.NoError(t, printSlices(&session{out: newPrinter(&b, "table")}, resp, ""))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 4, b.String())
	assert.Equal(t, []string{"START", "END", "REPLICAS", "PRIMARY", "LOAD", "KEYS", "PINNED"}, strings.Fields(lines[0]))
	assert.Equal(t, "a", strings.Fields(lines[1])[3])
	assert.Contains(t, lines[2], "b -> a #9", "the primary's fencing token")

	b.Reset()
	resp.Slices[0].Primary, resp.Slices[1].Primary, resp.Slices[1].Next = "", "", ""
	require.NoError(t, printSlices(&session{out: newPrinter(&b, "table")}, resp, ""))
	assert.NotContains(t, b.String(), "PRIMARY", "no column in a cluster without roles")
}

// TestNodesShowLoadingAndPrimaries checks that the node listing counts the slices each node
// loads and is the primary of, in columns that appear only when they say something.
func TestNodesShowLoadingAndPrimaries(t *testing.T) {
	nodes := []*pb.NodeInfo{
		{Node: &pb.Node{Id: "a"}, Slices: 3, Loading: 1, Primaries: 2, Roles: "primary-secondary"},
		{Node: &pb.Node{Id: "b"}, Slices: 2, Primaries: 1, Roles: "primary-secondary"},
	}
	var b bytes.Buffer
	require.NoError(t, printNodes(&session{out: newPrinter(&b, "table")}, nodes))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 3, b.String())
	head := strings.Fields(lines[0])
	require.Equal(t, []string{"ID", "ADDRESS", "CAPACITY", "SLICES", "LOADING", "PRIMARIES", "LOAD"}, head[:7])
	assert.Equal(t, []string{"1", "2"}, strings.Fields(lines[1])[3:5], "a: 1 loading, 2 primaries (no address column value)")

	b.Reset()
	nodes[0].Loading, nodes[0].Primaries, nodes[1].Primaries, nodes[0].Roles, nodes[1].Roles = 0, 0, 0, "", ""
	require.NoError(t, printNodes(&session{out: newPrinter(&b, "table")}, nodes))
	assert.NotContains(t, b.String(), "LOADING")
	assert.NotContains(t, b.String(), "PRIMARIES")
}
