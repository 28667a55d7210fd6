package wire

import (
	"fmt"
	"maps"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// PositionToProto encodes a position in the stream of quanta.
func PositionToProto(p quantum.Position) *pb.Position { return &pb.Position{Term: p.Term, Seq: p.Seq} }

// PositionFromProto decodes a position; nil stays nil (no position).
func PositionFromProto(p *pb.Position) *quantum.Position {
	if p == nil {
		return nil
	}
	return &quantum.Position{Term: p.GetTerm(), Seq: p.GetSeq()}
}

// QuantumToProto encodes a quantum.
func QuantumToProto(q quantum.Quantum) *pb.Quantum {
	out := &pb.Quantum{
		Position: PositionToProto(q.Position), Clock: q.Clock, Generation: q.Generation,
		Ops: OpsToProto(q.Ops), Cause: q.Cause, Time: timestamppb.New(q.Time), By: q.By,
	}
	if q.Snapshot != nil {
		out.Reinitializing, out.Assignment = true, AssignmentToProto(q.Snapshot)
	}
	if q.Distributors != nil {
		out.Distributors = &pb.DistributorSet{Addresses: q.Distributors}
	}
	return out
}

// QuantumFromProto decodes and validates a quantum: every quantum, clock-only ones
// included, must carry its term, and a reinitializing one a valid map and no operations.
func QuantumFromProto(m *pb.Quantum) (quantum.Quantum, error) {
	if m == nil || m.GetPosition() == nil {
		return quantum.Quantum{}, fmt.Errorf("%w: a quantum without a position", ErrInvalid)
	}
	if m.GetPosition().GetTerm() == 0 {
		// Terms start at 1; a receiver fences off older terms by comparing them.
		return quantum.Quantum{}, fmt.Errorf("%w: a quantum without a term", ErrInvalid)
	}
	q := quantum.Quantum{Position: *PositionFromProto(m.GetPosition()), Clock: m.GetClock(),
		Generation: m.GetGeneration(), Cause: m.GetCause(), By: m.GetBy(), Time: m.GetTime().AsTime()}
	if m.GetDistributors() != nil {
		q.Distributors = quantum.Distributors(maps.Clone(m.GetDistributors().GetAddresses()))
		if q.Distributors == nil {
			q.Distributors = quantum.Distributors{}
		}
	}
	if m.GetReinitializing() {
		if len(m.GetOps()) > 0 {
			return quantum.Quantum{}, fmt.Errorf("%w: quantum %s is reinitializing but has %d ops", ErrInvalid, q.Position, len(m.GetOps()))
		}
		a, err := AssignmentFromProto(m.GetAssignment())
		if err != nil {
			return quantum.Quantum{}, fmt.Errorf("quantum %s: %w", q.Position, err)
		}
		if a.Generation() != q.Generation {
			return quantum.Quantum{}, fmt.Errorf("%w: quantum %s is of generation %d but carries a map of generation %d",
				ErrInvalid, q.Position, q.Generation, a.Generation())
		}
		q.Snapshot = a
		return q, nil
	}
	ops, err := OpsFromProto(m.GetOps())
	if err != nil {
		return quantum.Quantum{}, fmt.Errorf("quantum %s: %w", q.Position, err)
	}
	q.Ops = ops
	return q, nil
}
