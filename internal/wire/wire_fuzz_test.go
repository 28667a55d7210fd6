package wire

import (
	"math"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// The fuzz targets build each message from bytes with proto.Unmarshal, so the fuzzer explores
// what a peer can really send. Each checks that the conversion does not panic, that whatever
// it accepts holds the domain's invariants, and that accepted values survive the way back.

// seed adds the wire form of each message to the corpus.
func seed(f *testing.F, ms ...proto.Message) {
	f.Helper()
	for _, m := range ms {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// unmarshal fills m from b, reporting whether b is a message of m's type at all.
func unmarshal(b []byte, m proto.Message) bool { return proto.Unmarshal(b, m) == nil }

func rs(ids ...string) *pb.ReplicaSet { return &pb.ReplicaSet{Nodes: ids} }

func validAssignment() *pb.Assignment {
	return &pb.Assignment{Generation: 7, Starts: []uint64{0, 1 << 62, 1 << 63},
		Replicas: []*pb.ReplicaSet{rs("n1"), rs("n2", "n3"), rs("n1")}}
}

func FuzzAssignmentFromProto(f *testing.F) {
	seed(f, validAssignment(),
		&pb.Assignment{Starts: []uint64{0}, Replicas: []*pb.ReplicaSet{rs("a")}},
		&pb.Assignment{Starts: []uint64{0, math.MaxUint64}, Replicas: []*pb.ReplicaSet{rs("a"), rs("b")}},
		&pb.Assignment{Starts: []uint64{0, 5, 5}, Replicas: []*pb.ReplicaSet{rs("a"), rs("b"), rs("c")}},
		&pb.Assignment{Starts: []uint64{0}, Replicas: []*pb.ReplicaSet{rs("a", "a")}},
		&pb.Assignment{Starts: []uint64{0}, Replicas: []*pb.ReplicaSet{rs("bad id")}},
		&pb.Assignment{Starts: []uint64{0}, Replicas: []*pb.ReplicaSet{{}}},
		&pb.Assignment{Starts: []uint64{1}, Replicas: []*pb.ReplicaSet{rs("a")}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pb.Assignment
		if !unmarshal(b, &m) {
			return
		}
		a, err := AssignmentFromProto(&m)
		if err != nil {
			return
		}
		checkAssignment(t, a)
		if a.Generation() != m.GetGeneration() || a.Len() != len(m.GetStarts()) {
			t.Fatalf("decoded generation %d with %d slices from generation %d with %d starts",
				a.Generation(), a.Len(), m.GetGeneration(), len(m.GetStarts()))
		}
		back, err := AssignmentFromProto(AssignmentToProto(a))
		if err != nil || !back.Equal(a) || back.Generation() != a.Generation() {
			t.Fatalf("round trip: %v\n%s\nbecame\n%v", err, a, back)
		}
	})
}

// checkAssignment checks the invariants of a map: its slices partition the space, and each
// has a non-empty set of distinct, well-formed node IDs.
func checkAssignment(t *testing.T, a *assignment.Assignment) {
	t.Helper()
	next := keyspace.At(0)
	for _, s := range a.All() {
		if keyspace.At(s.Range.Start) != next || !s.Range.Valid() {
			t.Fatalf("slice %s does not continue the partition at %s:\n%s", s.Range, next, a)
		}
		next = s.Range.End
		if len(s.Replicas) == 0 {
			t.Fatalf("slice %s has no replica", s.Range)
		}
		seen := map[assignment.NodeID]bool{}
		for _, id := range s.Replicas {
			if err := id.Validate(); err != nil || seen[id] {
				t.Fatalf("slice %s: replica %q (valid: %v) is malformed or listed twice", s.Range, id, err)
			}
			seen[id] = true
		}
	}
	if !next.IsEnd() {
		t.Fatalf("the slices stop at %s:\n%s", next, a)
	}
}

func opsQuantum(ops ...*pb.Op) *pb.Quantum {
	return &pb.Quantum{Position: &pb.Position{Term: 1, Seq: 1}, Ops: ops}
}

func validOps() []*pb.Op {
	return []*pb.Op{
		{Op: &pb.Op_Split{Split: &pb.Split{Slice: 0, At: 1 << 62}}},
		{Op: &pb.Op_Assign{Assign: &pb.Assign{Slice: 1 << 62, Replicas: rs("n2", "n1")}}},
		{Op: &pb.Op_Merge{Merge: &pb.Merge{Left: 0}}},
	}
}

func FuzzOpsFromProto(f *testing.F) {
	seed(f, opsQuantum(validOps()...),
		opsQuantum(&pb.Op{}),
		opsQuantum(&pb.Op{Op: &pb.Op_Assign{Assign: &pb.Assign{Slice: 3}}}),
		opsQuantum(&pb.Op{Op: &pb.Op_Assign{Assign: &pb.Assign{Replicas: rs("")}}}),
		opsQuantum(&pb.Op{Op: &pb.Op_Split{}}, &pb.Op{Op: &pb.Op_Merge{}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pb.Quantum
		if !unmarshal(b, &m) {
			return
		}
		ops, err := OpsFromProto(m.GetOps())
		if err != nil {
			return
		}
		if len(ops) != len(m.GetOps()) {
			t.Fatalf("%d ops decoded from %d", len(ops), len(m.GetOps()))
		}
		checkOps(t, ops)
		back, err := OpsFromProto(OpsToProto(ops))
		if err != nil || !reflect.DeepEqual(back, ops) {
			t.Fatalf("round trip: %v\n%v\nbecame\n%v", err, ops, back)
		}
	})
}

// checkOps checks the form of operations: each is set, and assigns go to well-formed nodes.
func checkOps(t *testing.T, ops []assignment.Op) {
	t.Helper()
	for i, op := range ops {
		switch o := op.(type) {
		case assignment.Split, assignment.Merge:
		case assignment.Assign:
			if len(o.Replicas) == 0 {
				t.Fatalf("op %d assigns to no node", i)
			}
			for _, id := range o.Replicas {
				if err := id.Validate(); err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
			}
		default:
			t.Fatalf("op %d is %T", i, op)
		}
	}
}

func FuzzNodeFromProto(f *testing.F) {
	seed(f, &pb.Node{Id: "n1"}, &pb.Node{Id: "kv-0.kv:7000", Capacity: 2.5},
		&pb.Node{}, &pb.Node{Id: "n1", Capacity: math.Inf(1)}, &pb.Node{Id: "n1", Capacity: math.NaN()},
		&pb.Node{Id: "n1", Capacity: -1}, &pb.Node{Id: "a b"})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pb.Node
		if !unmarshal(b, &m) {
			return
		}
		n, err := NodeFromProto(&m)
		if err != nil {
			return
		}
		if err := n.Validate(); err != nil {
			t.Fatalf("accepted %+v: %v", n, err)
		}
		if w := n.Weight(); !(w > 0) || math.IsInf(w, 0) {
			t.Fatalf("accepted %+v, of weight %v", n, w)
		}
		back, err := NodeFromProto(NodeToProto(n))
		if err != nil || back != n {
			t.Fatalf("round trip: %v: %+v became %+v", err, n, back)
		}
	})
}

func FuzzRangeFromProto(f *testing.F) {
	seed(f, &pb.Range{Start: 0, End: 1 << 63}, &pb.Range{Start: 1 << 63, EndOfSpace: true},
		&pb.Range{}, &pb.Range{Start: 5, End: 5}, &pb.Range{Start: 9, End: 3},
		&pb.Range{Start: math.MaxUint64, EndOfSpace: true}, &pb.Range{Start: 1, End: 2, EndOfSpace: true})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pb.Range
		if !unmarshal(b, &m) {
			return
		}
		r, err := RangeFromProto(&m)
		if err != nil {
			return
		}
		if !r.Valid() || r.Start != m.GetStart() || r.End.IsEnd() != m.GetEndOfSpace() {
			t.Fatalf("accepted %s from %v", r, &m)
		}
		back, err := RangeFromProto(RangeToProto(r))
		if err != nil || back != r {
			t.Fatalf("round trip: %v: %s became %s", err, r, back)
		}
	})
}

func validReport() *pb.ReportLoadRequest {
	return &pb.ReportLoadRequest{NodeId: "n1", Window: durationpb.New(10 * time.Second),
		Starts: []uint64{0, 1 << 63}, Ends: []uint64{1 << 63, 0}, Loads: []float64{12.5, 3}, Keys: []float64{100, 20},
		HotKeys: []*pb.HotKey{{Hash: 42, Load: 7}}}
}

func FuzzReportFromProto(f *testing.F) {
	seed(f, validReport(),
		&pb.ReportLoadRequest{NodeId: "n1", Window: durationpb.New(time.Second)},
		&pb.ReportLoadRequest{NodeId: "n1", Window: durationpb.New(time.Second), Starts: []uint64{0}, Ends: []uint64{0}, Loads: []float64{1}},
		&pb.ReportLoadRequest{NodeId: "n1", Starts: []uint64{0}, Ends: []uint64{0}, Loads: []float64{1}},
		&pb.ReportLoadRequest{NodeId: "n1", Window: durationpb.New(-time.Second), Starts: []uint64{0, 1}, Ends: []uint64{0}, Loads: []float64{1}},
		&pb.ReportLoadRequest{NodeId: "n1", Window: &durationpb.Duration{Seconds: math.MaxInt64},
			Starts: []uint64{5}, Ends: []uint64{5}, Loads: []float64{math.NaN()}, Keys: []float64{math.Inf(1)}},
		&pb.ReportLoadRequest{NodeId: "n1", Window: durationpb.New(time.Second),
			Starts: []uint64{0}, Ends: []uint64{0}, Loads: []float64{1e308}, HotKeys: []*pb.HotKey{{Load: -1}}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pb.ReportLoadRequest
		if !unmarshal(b, &m) {
			return
		}
		r, err := ReportFromProto(&m)
		if err != nil {
			return
		}
		if len(r.Samples) != len(m.GetStarts()) || len(r.Samples) > MaxSamples || len(r.HotKeys) != len(m.GetHotKeys()) {
			t.Fatalf("%d samples and %d hot keys decoded from %d starts and %d hot keys",
				len(r.Samples), len(r.HotKeys), len(m.GetStarts()), len(m.GetHotKeys()))
		}
		back, err := ReportFromProto(ReportToProto(r))
		if err != nil || !sameReport(back, r) {
			t.Fatalf("round trip: %v\n%+v\nbecame\n%+v", err, r, back)
		}
		// The values are the estimator's to judge; it must judge without panicking, and what
		// it takes must keep every slice's estimate a number.
		est := load.NewEstimator(load.EstimatorConfig{})
		if est.Add(r) != nil {
			return
		}
		a, err := assignment.Uniform(4, func(int) []assignment.NodeID { return []assignment.NodeID{r.Node} })
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range est.Fold(a, time.Now()).Loads {
			if math.IsNaN(l) || l < 0 {
				t.Fatalf("slice %d has load %v from the accepted report %+v", i, l, r)
			}
		}
	})
}

// sameReport compares reports as the wire carries them: NaN equals NaN, and At is not sent.
func sameReport(a, b load.Report) bool {
	eq := func(x, y float64) bool { return x == y || math.IsNaN(x) && math.IsNaN(y) }
	if a.Node != b.Node || a.Window != b.Window || len(a.Samples) != len(b.Samples) || len(a.HotKeys) != len(b.HotKeys) {
		return false
	}
	for i, s := range a.Samples {
		o := b.Samples[i]
		if s.Range != o.Range || !eq(s.Load, o.Load) || !eq(s.Keys, o.Keys) {
			return false
		}
	}
	for i, k := range a.HotKeys {
		if k.Hash != b.HotKeys[i].Hash || !eq(k.Load, b.HotKeys[i].Load) {
			return false
		}
	}
	return true
}

func FuzzQuantumFromProto(f *testing.F) {
	now := timestamppb.New(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	seed(f,
		&pb.Quantum{Position: &pb.Position{Term: 3, Seq: 9}, Clock: 100, Generation: 7, Reinitializing: true,
			Assignment: validAssignment(), Cause: "leader elected", Time: now,
			Distributors: &pb.DistributorSet{Addresses: map[string]string{"d1": "127.0.0.1:7100"}}},
		&pb.Quantum{Position: &pb.Position{Term: 3, Seq: 10}, Clock: 101, Generation: 8, Ops: validOps(), Cause: "balance", Time: now},
		&pb.Quantum{Position: &pb.Position{Term: 3, Seq: 11}, Clock: 102, Distributors: &pb.DistributorSet{}},
		&pb.Quantum{},
		&pb.Quantum{Position: &pb.Position{}, Reinitializing: true},
		&pb.Quantum{Position: &pb.Position{}, Reinitializing: true, Assignment: validAssignment(), Ops: validOps()},
		&pb.Quantum{Position: &pb.Position{}, Reinitializing: true, Generation: 1, Assignment: validAssignment()},
		&pb.Quantum{Position: &pb.Position{}, Time: &timestamppb.Timestamp{Seconds: math.MaxInt64, Nanos: -1}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pb.Quantum
		if !unmarshal(b, &m) {
			return
		}
		q, err := QuantumFromProto(&m)
		if err != nil {
			return
		}
		checkQuantum(t, &m, q)
		back, err := QuantumFromProto(QuantumToProto(q))
		if err != nil {
			t.Fatalf("round trip of %s: %v", q.Position, err)
		}
		if back.Snapshot != nil && (q.Snapshot == nil || !back.Snapshot.Equal(q.Snapshot)) {
			t.Fatalf("round trip of %s changed the map", q.Position)
		}
		back.Snapshot, q.Snapshot = nil, nil
		if !back.Time.Equal(q.Time) {
			t.Fatalf("round trip of %s: time %v became %v", q.Position, q.Time, back.Time)
		}
		back.Time, q.Time = time.Time{}, time.Time{}
		if !reflect.DeepEqual(back, q) {
			t.Fatalf("round trip:\n%+v\nbecame\n%+v", q, back)
		}
	})
}

func checkQuantum(t *testing.T, m *pb.Quantum, q quantum.Quantum) {
	t.Helper()
	if q.Position.Term != m.GetPosition().GetTerm() || q.Position.Seq != m.GetPosition().GetSeq() {
		t.Fatalf("position %s decoded from %v", q.Position, m.GetPosition())
	}
	if (q.Distributors == nil) != (m.GetDistributors() == nil) {
		t.Fatalf("distributor set %v decoded from %v", q.Distributors, m.GetDistributors())
	}
	if m.GetReinitializing() {
		if q.Snapshot == nil || len(q.Ops) > 0 || q.Snapshot.Generation() != q.Generation {
			t.Fatalf("reinitializing quantum %s decoded with snapshot %v and %d ops", q.Position, q.Snapshot, len(q.Ops))
		}
		checkAssignment(t, q.Snapshot)
		return
	}
	if q.Snapshot != nil {
		t.Fatalf("quantum %s is not reinitializing but has a snapshot", q.Position)
	}
	checkOps(t, q.Ops)
}
