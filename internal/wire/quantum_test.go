package wire

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// Every quantum carries its term, clock-only ones included: receivers refuse older terms.
func TestQuantaCarryTheirTerm(t *testing.T) {
	q := quantum.Quantum{Position: quantum.Position{Term: 7, Seq: 3}, Clock: 40, Generation: 2, Cause: "clock", Time: time.Unix(5, 0)}
	back, err := QuantumFromProto(QuantumToProto(q))
	require.NoError(t, err)
	assert.True(t, back.ClockOnly())
	assert.Equal(t, quantum.Position{Term: 7, Seq: 3}, back.Position)

	_, err = QuantumFromProto(&pb.Quantum{Position: &pb.Position{Seq: 3}, Clock: 40})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "without a term")
}
