// Package wire converts the core model to and from its protobuf form in api/sliceplane/v1.
// Whatever arrives from the wire is untrusted: conversions from protobuf validate it and say
// exactly what is wrong.
package wire

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
)

// ErrInvalid is wrapped by every error about a malformed message.
var ErrInvalid = errors.New("wire: invalid message")

// MaxNodeIDBytes is the longest node ID (see assignment.NodeID).
const MaxNodeIDBytes = 128

// CheckNodeID checks the length of a node ID in field before anything quotes it whole; the
// rest of its form is for assignment.NodeID.Validate to judge.
func CheckNodeID(field, id string) error {
	if len(id) > MaxNodeIDBytes {
		return fmt.Errorf("%w: %s %s is %d bytes; at most %d", ErrInvalid, field, keyspace.Quote(id), len(id), MaxNodeIDBytes)
	}
	return nil
}

// CheckString checks that field holds at most limit bytes.
func CheckString(field, s string, limit int) error {
	if len(s) > limit {
		return fmt.Errorf("%w: %s %s is %d bytes; at most %d", ErrInvalid, field, keyspace.Quote(s), len(s), limit)
	}
	return nil
}

// AssignmentToProto encodes an assignment as boundaries and replica sets.
func AssignmentToProto(a *assignment.Assignment) *pb.Assignment {
	m := &pb.Assignment{
		Generation: a.Generation(),
		Starts:     make([]uint64, a.Len()),
		Replicas:   make([]*pb.ReplicaSet, a.Len()),
	}
	for i, s := range a.All() {
		m.Starts[i] = s.Range.Start
		m.Replicas[i] = replicaSet(s.Replicas, s.Loading, s.Leaving, s.Since, s.Primary, s.Next, s.Token)
	}
	return m
}

// AssignmentFromProto decodes and validates an assignment.
func AssignmentFromProto(m *pb.Assignment) (*assignment.Assignment, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: no assignment", ErrInvalid)
	}
	starts, reps := m.GetStarts(), m.GetReplicas()
	switch {
	case len(starts) == 0:
		return nil, fmt.Errorf("%w: assignment has no slices", ErrInvalid)
	case len(starts) != len(reps):
		return nil, fmt.Errorf("%w: assignment has %d slice starts but %d replica sets", ErrInvalid, len(starts), len(reps))
	case starts[0] != 0:
		return nil, fmt.Errorf("%w: the first slice starts at %s, not 0", ErrInvalid, keyspace.FormatPoint(starts[0]))
	}
	ss := make([]assignment.Slice, len(starts))
	for i, start := range starts {
		end := keyspace.End
		if i+1 < len(starts) {
			if starts[i+1] <= start {
				return nil, fmt.Errorf("%w: slice starts are not ascending at %d: %s then %s",
					ErrInvalid, i+1, keyspace.FormatPoint(start), keyspace.FormatPoint(starts[i+1]))
			}
			end = keyspace.At(starts[i+1])
		}
		ss[i] = assignment.Slice{Range: keyspace.Range{Start: start, End: end}, Replicas: nodeIDs(reps[i].GetNodes()),
			Loading: optNodeIDs(reps[i].GetLoading()), Leaving: optNodeIDs(reps[i].GetLeaving()), Since: reps[i].GetSince(),
			Primary: assignment.NodeID(reps[i].GetPrimary()), Next: assignment.NodeID(reps[i].GetNext()), Token: reps[i].GetToken()}
	}
	a, err := assignment.New(m.GetGeneration(), ss)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return a, nil
}

// OpsToProto encodes operations.
func OpsToProto(ops []assignment.Op) []*pb.Op {
	out := make([]*pb.Op, len(ops))
	for i, op := range ops {
		switch o := op.(type) {
		case assignment.Split:
			out[i] = &pb.Op{Op: &pb.Op_Split{Split: &pb.Split{Slice: o.Slice, At: o.At}}}
		case assignment.Merge:
			out[i] = &pb.Op{Op: &pb.Op_Merge{Merge: &pb.Merge{Left: o.Left}}}
		case assignment.Assign:
			out[i] = &pb.Op{Op: &pb.Op_Assign{Assign: &pb.Assign{Slice: o.Slice,
				Replicas: replicaSet(o.Replicas, o.Loading, o.Leaving, o.Since, o.Primary, o.Next, o.Token)}}}
		default:
			panic(fmt.Sprintf("wire: unknown operation type %T", op)) // the set of operations is closed
		}
	}
	return out
}

// OpsFromProto decodes operations. It checks their form (an operation is set, replica sets
// are well formed); whether they apply is for assignment.Apply to say.
func OpsFromProto(ms []*pb.Op) ([]assignment.Op, error) {
	out := make([]assignment.Op, len(ms))
	for i, m := range ms {
		switch o := m.GetOp().(type) {
		case *pb.Op_Split:
			out[i] = assignment.Split{Slice: o.Split.GetSlice(), At: o.Split.GetAt()}
		case *pb.Op_Merge:
			out[i] = assignment.Merge{Left: o.Merge.GetLeft()}
		case *pb.Op_Assign:
			rs := o.Assign.GetReplicas()
			reps := nodeIDs(rs.GetNodes())
			if len(reps) == 0 {
				return nil, fmt.Errorf("%w: op %d assigns slice %s to no node", ErrInvalid, i, keyspace.FormatPoint(o.Assign.GetSlice()))
			}
			for _, id := range reps {
				if err := id.Validate(); err != nil {
					return nil, fmt.Errorf("%w: op %d: %w", ErrInvalid, i, err)
				}
			}
			out[i] = assignment.Assign{Slice: o.Assign.GetSlice(), Replicas: reps,
				Loading: optNodeIDs(rs.GetLoading()), Leaving: optNodeIDs(rs.GetLeaving()), Since: rs.GetSince(),
				Primary: assignment.NodeID(rs.GetPrimary()), Next: assignment.NodeID(rs.GetNext()), Token: rs.GetToken()}
		default:
			return nil, fmt.Errorf("%w: op %d is empty", ErrInvalid, i)
		}
	}
	return out, nil
}

// NodeToProto encodes a node.
func NodeToProto(n assignment.Node) *pb.Node {
	return &pb.Node{Id: string(n.ID), Capacity: n.Capacity}
}

// NodeFromProto decodes and validates a node.
func NodeFromProto(m *pb.Node) (assignment.Node, error) {
	if err := CheckNodeID("node.id", m.GetId()); err != nil {
		return assignment.Node{}, err
	}
	n := assignment.Node{ID: assignment.NodeID(m.GetId()), Capacity: m.GetCapacity()}
	if err := n.Validate(); err != nil {
		return assignment.Node{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return n, nil
}

func replicaSet(ids, loading, leaving []assignment.NodeID, since uint64, primary, next assignment.NodeID, token uint64) *pb.ReplicaSet {
	return &pb.ReplicaSet{Nodes: nodeStrings(ids), Loading: nodeStrings(loading), Leaving: nodeStrings(leaving), Since: since,
		Primary: string(primary), Next: string(next), Token: token}
}

func nodeStrings(ids []assignment.NodeID) []string {
	if len(ids) == 0 {
		return nil
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = string(id)
	}
	return out
}

// optNodeIDs is nodeIDs keeping an empty list nil, as a slice with no handoff has it.
func optNodeIDs(nodes []string) []assignment.NodeID {
	if len(nodes) == 0 {
		return nil
	}
	return nodeIDs(nodes)
}

func nodeIDs(nodes []string) []assignment.NodeID {
	ids := make([]assignment.NodeID, len(nodes))
	for i, n := range nodes {
		ids[i] = assignment.NodeID(n)
	}
	return ids
}

// RangeToProto encodes a range.
func RangeToProto(r keyspace.Range) *pb.Range {
	if r.End.IsEnd() {
		return &pb.Range{Start: r.Start, EndOfSpace: true}
	}
	return &pb.Range{Start: r.Start, End: r.End.Point()}
}

// RangeFromProto decodes a range and checks that it holds at least one point.
func RangeFromProto(m *pb.Range) (keyspace.Range, error) {
	if m == nil {
		return keyspace.Range{}, fmt.Errorf("%w: no range", ErrInvalid)
	}
	r := keyspace.Range{Start: m.GetStart(), End: keyspace.At(m.GetEnd())}
	if m.GetEndOfSpace() {
		r.End = keyspace.End
	}
	if !r.Valid() {
		return keyspace.Range{}, fmt.Errorf("%w: range %s is empty", ErrInvalid, r)
	}
	return r, nil
}

// MaxSamples bounds the samples of one load report, MaxHotKeys its hot keys.
const (
	MaxSamples = 1 << 20
	MaxHotKeys = 1 << 10
)

// ReportToProto encodes a load report as columns (see ReportLoadRequest). Its At is not sent:
// the assigner stamps reports when they arrive.
func ReportToProto(r load.Report) *pb.ReportLoadRequest {
	n := len(r.Samples)
	req := &pb.ReportLoadRequest{NodeId: string(r.Node), Window: durationpb.New(r.Window),
		Starts: make([]uint64, n), Ends: make([]uint64, n), Loads: make([]float64, n), Keys: make([]float64, n)}
	for i, s := range r.Samples {
		req.Starts[i], req.Loads[i], req.Keys[i] = s.Range.Start, s.Load, s.Keys
		if !s.Range.End.IsEnd() {
			req.Ends[i] = s.Range.End.Point() // 0 stands for the end of the space
		}
	}
	for _, k := range r.HotKeys {
		req.HotKeys = append(req.HotKeys, &pb.HotKey{Hash: k.Hash, Load: k.Load})
	}
	return req
}

// ReportFromProto decodes a load report. It checks the columns' shape; the values are for
// load.Estimator to validate.
func ReportFromProto(req *pb.ReportLoadRequest) (load.Report, error) {
	n := len(req.GetStarts())
	switch {
	case n > MaxSamples:
		return load.Report{}, fmt.Errorf("%w: %d samples in one report; at most %d", ErrInvalid, n, MaxSamples)
	case len(req.GetEnds()) != n || len(req.GetLoads()) != n || len(req.GetKeys()) != n && len(req.GetKeys()) != 0:
		return load.Report{}, fmt.Errorf("%w: the sample columns differ in length: %d starts, %d ends, %d loads, %d keys",
			ErrInvalid, n, len(req.GetEnds()), len(req.GetLoads()), len(req.GetKeys()))
	case req.GetWindow() == nil:
		return load.Report{}, fmt.Errorf("%w: the report has no window", ErrInvalid)
	case len(req.GetHotKeys()) > MaxHotKeys:
		return load.Report{}, fmt.Errorf("%w: %d hot keys in one report; at most %d", ErrInvalid, len(req.GetHotKeys()), MaxHotKeys)
	}
	if err := CheckNodeID("node_id", req.GetNodeId()); err != nil {
		return load.Report{}, err
	}
	r := load.Report{Node: assignment.NodeID(req.GetNodeId()), Window: req.GetWindow().AsDuration(), Samples: make([]load.Sample, n)}
	starts, ends, loads, keys := req.GetStarts(), req.GetEnds(), req.GetLoads(), req.GetKeys()
	for i := range n {
		s := load.Sample{Range: keyspace.Range{Start: starts[i], End: keyspace.At(ends[i])}, Load: loads[i]}
		if ends[i] == 0 {
			s.Range.End = keyspace.End
		}
		if len(keys) > 0 {
			s.Keys = keys[i]
		}
		r.Samples[i] = s
	}
	for _, k := range req.GetHotKeys() {
		r.HotKeys = append(r.HotKeys, load.HotKey{Hash: k.GetHash(), Load: k.GetLoad()})
	}
	return r, nil
}
