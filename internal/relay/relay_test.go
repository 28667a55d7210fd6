package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A relay vouches for its map only while its stream speaks and its map keeps up with it.
func TestARelayStopsVouchingWhenItsStreamIsSilentOrAhead(t *testing.T) {
	r := New()
	now := time.Now()
	const limit = 2 * time.Second
	assert.False(t, r.Live(now, limit), "it never heard the assigner")
	r.Heard(now)
	assert.True(t, r.Live(now.Add(limit/2), limit))
	assert.False(t, r.Live(now.Add(limit), limit), "silent for the limit")

	m, err := assignment.Uniform(4, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	_, err = r.Take(quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 1}, Snapshot: m, Generation: m.Generation()})
	require.NoError(t, err)
	_, err = r.Take(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 9}, Snapshot: m})
	require.ErrorIs(t, err, ErrOlderTerm)
	assert.True(t, r.Live(now, limit), "a deposed leader's quantum leaves the map as good as it was")

	_, err = r.Take(quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 3}, Generation: 1,
		Ops: []assignment.Op{assignment.Assign{Slice: 0, Replicas: []assignment.NodeID{"b"}}}})
	require.ErrorIs(t, err, ErrRefused)
	assert.False(t, r.Live(now, limit), "a quantum was missed: the map is behind the stream")
	out, err := r.Take(quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 3}, Snapshot: m, Generation: m.Generation()})
	require.NoError(t, err)
	assert.Equal(t, Reset, out)
	assert.True(t, r.Live(now, limit), "the stream started over: the map is current again")
}
