package assigner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/frame"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/store"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// UserMetadata is the gRPC metadata key in which a client says who it acts for (slicectl
// sends the operator's login). It is a claim, not an identity: anyone can send any value, so
// the audit trail records the caller authz authenticated (authz.Caller) and logs this only
// beside it, as "claims".
const UserMetadata = "x-sliceplane-user"

// api implements the gRPC services on a Server.
type api struct {
	pb.UnimplementedAssignmentServiceServer
	pb.UnimplementedQuantaServiceServer
	pb.UnimplementedNodeServiceServer
	pb.UnimplementedAdminServiceServer
	s       *Server
	reinits reinitCache
	fresh   *freshness
}

// leader returns the leadership, or a status that says where the leader is.
func (a *api) leader() (*leadership, error) {
	if l := a.s.leading.Load(); l != nil {
		return l, nil
	}
	return nil, a.notLeader()
}

func (a *api) notLeader() error {
	if addr, _ := a.s.leaderAddr.Load().(string); addr != "" {
		return status.Errorf(codes.Unavailable, "assigner: not the leader; the leader is at %s", addr)
	}
	return status.Error(codes.Unavailable, "assigner: not the leader, and no leader is known yet")
}

// toStatus maps an error of the core or the store to a gRPC status.
func (a *api) toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotLeader), errors.Is(err, store.ErrFenced):
		return a.notLeader()
	case errors.Is(err, ErrUnknownNode):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrInvalid), errors.Is(err, wire.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrPrecondition):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	// What is left comes from etcd: most likely passing.
	return status.Error(codes.Unavailable, err.Error())
}

// call runs fn in the leader's loop and maps its error.
func (a *api) call(ctx context.Context, name string, fn func(c *Core, now time.Time) (*Proposal, any, error)) (any, *Proposal, error) {
	l, err := a.leader()
	if err != nil {
		return nil, nil, err
	}
	var claims string
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(UserMetadata)) > 0 {
		claims = md.Get(UserMetadata)[0]
	}
	res, p, err := l.do(ctx, caller{call: name, who: authz.Caller(ctx), claims: claims}, fn)
	if name != "" && isAdmin(name) {
		result := "ok"
		if err != nil {
			result = "refused"
		}
		a.s.metrics.adminChanges.WithLabelValues(name, result).Inc()
	}
	return res, p, a.toStatus(err)
}

func isAdmin(call string) bool {
	switch call {
	case "move", "split", "merge", "pin", "unpin", "drain", "freeze", "unfreeze", "set_algorithm":
		return true
	}
	return false
}

// audited reports whether a call changes the cluster on someone's behalf, and so goes into
// the audit trail: every admin change, and nodes joining and leaving.
func audited(call string) bool { return isAdmin(call) || call == "register" || call == "deregister" }

// change describes a persisted admin proposal.
func change(p *Proposal) *pb.Change {
	out := &pb.Change{Summary: p.Summary, Position: &pb.Position{Term: p.Meta.Term, Seq: p.Meta.Seq}, Generation: p.Meta.Generation}
	if q := p.Quantum; q != nil {
		out.Position = wire.PositionToProto(q.Position)
		out.Generation = q.Generation
		out.Ops = wire.OpsToProto(q.Ops)
	}
	return out
}

// encodeQuantum returns the wire form of a watch response carrying q.
func encodeQuantum(q quantum.Quantum) ([]byte, error) {
	return proto.Marshal(&pb.WatchQuantaResponse{Quantum: wire.QuantumToProto(q)})
}

// reinitCache holds the encoding of the last reinitializing quantum. When many watchers
// connect at once (after a failover, all of them), the map is encoded once, not once per
// watcher: for 150k slices that is 4.5 MB each time, and encoding it a hundred times over
// starved the leader's own etcd lease in a benchmark.
type reinitCache struct {
	mu   sync.Mutex
	pos  quantum.Position
	data []byte
}

// reinit returns the encoding of a reinitializing quantum.
func (a *api) reinit(q quantum.Quantum) ([]byte, error) {
	c := &a.reinits
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.data != nil && c.pos == q.Position {
		return c.data, nil
	}
	data, err := encodeQuantum(q)
	if err != nil {
		return nil, err
	}
	c.pos, c.data = q.Position, data
	return data, nil
}

// AssignmentService

func (a *api) WatchAssignment(req *pb.WatchAssignmentRequest, stream pb.AssignmentService_WatchAssignmentServer) error {
	return a.watch(stream, req.GetFrom(), false)
}

func (a *api) watch(stream grpc.ServerStream, from *pb.Position, clockQuanta bool) error {
	l, err := a.leader()
	if err != nil {
		return err
	}
	sub := l.hub.Subscribe(wire.PositionFromProto(from), clockQuanta)
	a.s.metrics.watchers.Inc()
	defer a.s.metrics.watchers.Dec()
	for {
		q, err := a.next(stream.Context(), sub)
		if errors.Is(err, errIdle) {
			// Nothing to send: say so, so that watchers tell an idle leader from a hung one.
			if err := stream.SendMsg(&frame.Frame{Data: heartbeatFrame}); err != nil {
				return err
			}
			continue
		}
		if errors.Is(err, quantum.ErrClosed) {
			return status.Error(codes.Unavailable, "assigner: this assigner stopped leading; reconnect to the leader")
		}
		if err != nil {
			return status.FromContextError(err).Err()
		}
		var msg any
		if data, ok := q.Payload.([]byte); ok {
			msg = &frame.Frame{Data: data}
		} else if data, err := a.reinit(q); err == nil {
			msg = &frame.Frame{Data: data}
		} else {
			return status.Errorf(codes.Internal, "assigner: encoding the map: %v", err)
		}
		if err := stream.SendMsg(msg); err != nil {
			return err
		}
	}
}

// errIdle says a watch had nothing to send for a heartbeat interval.
var errIdle = errors.New("assigner: idle")

// heartbeatFrame is the encoding of a watch response that only says the leader is alive
// (WatchQuantaResponse and WatchAssignmentResponse share it).
var heartbeatFrame, _ = proto.Marshal(&pb.WatchQuantaResponse{Heartbeat: true})

// next returns the subscription's next quantum, or errIdle after a heartbeat interval
// without one.
func (a *api) next(ctx context.Context, sub *quantum.Subscription) (quantum.Quantum, error) {
	wait, cancel := context.WithTimeout(ctx, dial.StreamHeartbeat)
	defer cancel()
	q, err := sub.Next(wait)
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return q, errIdle
	}
	return q, err
}

func (a *api) GetAssignment(context.Context, *pb.GetAssignmentRequest) (*pb.GetAssignmentResponse, error) {
	l, err := a.leader()
	if err != nil {
		return nil, err
	}
	m, pos, clock := l.hub.Current()
	if m == nil {
		return nil, a.toStatus(ErrNoMap)
	}
	return &pb.GetAssignmentResponse{Position: wire.PositionToProto(pos), Clock: clock, Assignment: wire.AssignmentToProto(m)}, nil
}

func (a *api) Lookup(_ context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	l, err := a.leader()
	if err != nil {
		return nil, err
	}
	var h uint64
	switch t := req.GetTarget().(type) {
	case *pb.LookupRequest_Key:
		if len(t.Key) > maxLookupKey {
			return nil, status.Errorf(codes.InvalidArgument, "assigner: a key of %d bytes; at most %d", len(t.Key), maxLookupKey)
		}
		h = keyspace.Hash(t.Key)
	case *pb.LookupRequest_Hash:
		h = t.Hash
	default:
		return nil, status.Error(codes.InvalidArgument, "assigner: lookup needs a key or a hash")
	}
	m, _, _ := l.hub.Current()
	if m == nil {
		return nil, a.toStatus(ErrNoMap)
	}
	_, s := m.Lookup(h)
	return &pb.LookupResponse{Hash: h, Slice: wire.RangeToProto(s.Range), Replicas: nodeStrings(s.Replicas), Generation: m.Generation()}, nil
}

// QuantaService

func (a *api) WatchQuanta(req *pb.WatchQuantaRequest, stream pb.QuantaService_WatchQuantaServer) error {
	return a.watch(stream, req.GetFrom(), true)
}

// NodeService

func (a *api) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	n, err := wire.NodeFromProto(req.GetNode())
	if err != nil {
		return nil, a.toStatus(err)
	}
	rec := store.Node{Node: n, Address: req.GetAddress(), Labels: maps.Clone(req.GetLabels())}
	res, _, err := a.call(ctx, "register", func(c *Core, now time.Time) (*Proposal, any, error) {
		p, err := c.Register(rec, now)
		return p, &pb.RegisterResponse{Ttl: durationpb.New(a.s.cfg.Core.NodeTTL), Distributor: distributorFor(c, n.ID)}, err
	})
	if err != nil {
		return nil, err
	}
	return res.(*pb.RegisterResponse), nil
}

func (a *api) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	if err := wire.CheckNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, a.toStatus(err)
	}
	id := assignment.NodeID(req.GetNodeId())
	silence := req.GetSilence().AsDuration()
	if silence < 0 || !req.GetSilence().IsValid() {
		silence = 0
	}
	res, _, err := a.call(ctx, "heartbeat", func(c *Core, now time.Time) (*Proposal, any, error) {
		draining, err := c.Heartbeat(id, now)
		if err == nil {
			a.fresh.record(id, req.GetStale(), silence, now, a.s.cfg.Core.NodeTTL)
		}
		return nil, &pb.HeartbeatResponse{Ttl: durationpb.New(a.s.cfg.Core.NodeTTL), Draining: draining,
			Distributor: distributorFor(c, id)}, err
	})
	if err != nil {
		return nil, err
	}
	return res.(*pb.HeartbeatResponse), nil
}

// distributorFor says which distributor serves node id, or nil while there is none. It reads
// the core's set, which is current even before the first map carries it to the hub.
func distributorFor(c *Core, id assignment.NodeID) *pb.Distributor {
	d, addr, ok := c.Distributors().For(id)
	if !ok {
		return nil
	}
	return &pb.Distributor{Id: d, Address: addr}
}

func (a *api) Deregister(ctx context.Context, req *pb.DeregisterRequest) (*pb.DeregisterResponse, error) {
	if err := wire.CheckNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, a.toStatus(err)
	}
	if _, _, err := a.call(ctx, "deregister", func(c *Core, _ time.Time) (*Proposal, any, error) {
		p, err := c.Deregister(assignment.NodeID(req.GetNodeId()))
		return p, nil, err
	}); err != nil {
		return nil, err
	}
	return &pb.DeregisterResponse{}, nil
}

func (a *api) ReportLoad(ctx context.Context, req *pb.ReportLoadRequest) (*pb.ReportLoadResponse, error) {
	r, err := wire.ReportFromProto(req)
	if err != nil {
		a.s.metrics.reports.WithLabelValues("rejected").Inc()
		a.s.metrics.reportsRejected.WithLabelValues("malformed").Inc()
		return nil, a.toStatus(err)
	}
	// The core's verdict comes back as the result, not through a variable both goroutines
	// share: a call that gives up waiting (its context ended) may be run by the leader after
	// it returned.
	res, _, err := a.call(ctx, "", func(c *Core, now time.Time) (*Proposal, any, error) {
		r.At = now
		refused := c.Report(r, now)
		return nil, refused, refused
	})
	refused, _ := res.(error) // the core's verdict, not a failure to reach it
	result := "accepted"
	if err != nil {
		result = "rejected"
	}
	a.s.metrics.reports.WithLabelValues(result).Inc()
	if refused != nil {
		a.s.metrics.reportsRejected.WithLabelValues(rejectReason(refused)).Inc()
	}
	if err != nil {
		return nil, err
	}
	return &pb.ReportLoadResponse{}, nil
}

// rejectReason names why the core refused a report, for the metric's bounded label.
func rejectReason(err error) string {
	if errors.Is(err, ErrUnknownNode) {
		return "unknown_node"
	}
	return load.Reason(err)
}

// AdminService

func (a *api) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	leaderAddr, _ := a.s.leaderAddr.Load().(string)
	if a.s.leading.Load() == nil {
		return &pb.StatusResponse{Leader: false, LeaderAddress: leaderAddr}, nil
	}
	res, _, err := a.call(ctx, "status", func(c *Core, _ time.Time) (*Proposal, any, error) { return nil, c.Status(), nil })
	if err != nil {
		return nil, err
	}
	st := res.(Status)
	out := &pb.StatusResponse{
		Leader: true, LeaderAddress: a.s.cfg.Advertise, Position: wire.PositionToProto(st.Position), Clock: st.Clock,
		Generation: st.Generation, Imbalance: st.Imbalance, Slices: uint32(st.Slices), Nodes: uint32(st.Nodes),
		Frozen: st.Frozen, Algorithm: st.Algorithm, Params: st.Params,
	}
	if !st.LastPass.IsZero() {
		out.LastPass = timestamppb.New(st.LastPass)
	}
	out.PassFailures, out.PassError = st.PassFailures, st.PassError
	if !st.PassErrorTime.IsZero() {
		out.PassErrorTime = timestamppb.New(st.PassErrorTime)
	}
	for _, r := range st.Pinned {
		out.Pinned = append(out.Pinned, wire.RangeToProto(r))
	}
	return out, nil
}

func (a *api) ListNodes(ctx context.Context, _ *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	res, _, err := a.call(ctx, "list_nodes", func(c *Core, _ time.Time) (*Proposal, any, error) { return nil, c.Nodes(), nil })
	if err != nil {
		return nil, err
	}
	out := &pb.ListNodesResponse{}
	now := time.Now()
	for _, n := range res.([]NodeInfo) {
		info := &pb.NodeInfo{Node: wire.NodeToProto(n.Node.Node), Address: n.Address, Labels: n.Labels,
			Draining: n.Draining, Slices: uint32(n.Slices), Load: n.Load, LastSeen: timestamppb.New(n.LastSeen)}
		if f, ok := a.fresh.of(n.Node.ID, now, a.s.cfg.Core.NodeTTL); ok {
			info.Stale = f.stale
			if f.silence > 0 {
				info.Silence = durationpb.New(f.silence)
			}
		}
		out.Nodes = append(out.Nodes, info)
	}
	return out, nil
}

func (a *api) ListSlices(ctx context.Context, req *pb.ListSlicesRequest) (*pb.ListSlicesResponse, error) {
	if err := wire.CheckNodeID("node", req.GetNode()); err != nil {
		return nil, a.toStatus(err)
	}
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = 1000
	}
	limit = min(limit, maxListedSlices)
	type result struct {
		slices []SliceInfo
		total  int
	}
	res, _, err := a.call(ctx, "list_slices", func(c *Core, _ time.Time) (*Proposal, any, error) {
		s, total, err := c.Slices(assignment.NodeID(req.GetNode()), req.GetByLoad(), limit)
		return nil, result{s, total}, err
	})
	if err != nil {
		return nil, err
	}
	r := res.(result)
	out := &pb.ListSlicesResponse{Total: uint32(r.total)}
	for _, s := range r.slices {
		out.Slices = append(out.Slices, &pb.SliceInfo{Range: wire.RangeToProto(s.Range), Replicas: nodeStrings(s.Replicas),
			Load: s.Load, Keys: s.Keys, Pinned: s.Pinned})
	}
	return out, nil
}

func (a *api) ListQuanta(_ context.Context, req *pb.ListQuantaRequest) (*pb.ListQuantaResponse, error) {
	l, err := a.leader()
	if err != nil {
		return nil, err
	}
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = 100
	}
	limit = min(limit, maxListQuanta)
	out := &pb.ListQuantaResponse{}
	for _, q := range l.hub.Recent(limit, req.GetIncludeClock()) {
		p := wire.QuantumToProto(q)
		p.Assignment = nil // the whole map is not history; GetAssignment gives it
		out.Quanta = append(out.Quanta, p)
	}
	return out, nil
}

// admin runs a map-changing admin call and describes the change.
func (a *api) admin(ctx context.Context, name string, fn func(c *Core, now time.Time) (*Proposal, error)) (*pb.Change, error) {
	_, p, err := a.call(ctx, name, func(c *Core, now time.Time) (*Proposal, any, error) {
		p, err := fn(c, now)
		return p, nil, err
	})
	if err != nil {
		return nil, err
	}
	return change(p), nil
}

// Bounds on admin requests' fields, so that no request makes the assigner store, compute or
// echo without limit.
const (
	maxKeyBytes     = 4096 // a key naming a slice
	maxReplicas     = 64   // nodes a move names
	maxReasonBytes  = 1024 // a freeze's reason
	maxParams       = 32   // an algorithm's constants
	maxParamBytes   = 64   // an algorithm's name, a constant's name or value
	maxLookupKey    = 64 << 10
	maxListQuanta   = 10000
	maxListedSlices = 1 << 20
)

// checkRef bounds a slice reference.
func checkRef(field string, r *pb.SliceRef) error {
	return wire.CheckString(field+".key", string(r.GetKey()), maxKeyBytes)
}

func sliceRef(r *pb.SliceRef) SliceRef {
	switch v := r.GetRef().(type) {
	case *pb.SliceRef_Start:
		return SliceRef{Start: &v.Start}
	case *pb.SliceRef_Key:
		return SliceRef{Key: v.Key}
	case *pb.SliceRef_Hash:
		return SliceRef{Hash: &v.Hash}
	}
	return SliceRef{}
}

func (a *api) Move(ctx context.Context, req *pb.MoveRequest) (*pb.MoveResponse, error) {
	if len(req.GetTo()) > maxReplicas {
		return nil, status.Errorf(codes.InvalidArgument, "assigner: moving a slice to %d nodes; at most %d", len(req.GetTo()), maxReplicas)
	}
	if err := checkRef("slice", req.GetSlice()); err != nil {
		return nil, a.toStatus(err)
	}
	to := make([]assignment.NodeID, len(req.GetTo()))
	for i, id := range req.GetTo() {
		if err := wire.CheckNodeID(fmt.Sprintf("to[%d]", i), id); err != nil {
			return nil, a.toStatus(err)
		}
		to[i] = assignment.NodeID(id)
	}
	ch, err := a.admin(ctx, "move", func(c *Core, now time.Time) (*Proposal, error) { return c.Move(sliceRef(req.GetSlice()), to, now) })
	if err != nil {
		return nil, err
	}
	return &pb.MoveResponse{Change: ch}, nil
}

func (a *api) Split(ctx context.Context, req *pb.SplitRequest) (*pb.SplitResponse, error) {
	var at *uint64
	switch v := req.GetAt().(type) {
	case *pb.SplitRequest_AtHash:
		at = &v.AtHash
	case *pb.SplitRequest_AtKey:
		if err := wire.CheckString("at_key", string(v.AtKey), maxKeyBytes); err != nil {
			return nil, a.toStatus(err)
		}
		h := keyspace.Hash(v.AtKey)
		at = &h
	}
	if err := checkRef("slice", req.GetSlice()); err != nil {
		return nil, a.toStatus(err)
	}
	ref := sliceRef(req.GetSlice())
	if ref.Start == nil && ref.Key == nil && ref.Hash == nil && at != nil {
		ref.Hash = at // "split at this key": the slice holding it
	}
	ch, err := a.admin(ctx, "split", func(c *Core, now time.Time) (*Proposal, error) { return c.Split(ref, at, now) })
	if err != nil {
		return nil, err
	}
	return &pb.SplitResponse{Change: ch}, nil
}

func (a *api) Merge(ctx context.Context, req *pb.MergeRequest) (*pb.MergeResponse, error) {
	if err := errors.Join(checkRef("left", req.GetLeft()), checkRef("right", req.GetRight())); err != nil {
		return nil, a.toStatus(err)
	}
	ch, err := a.admin(ctx, "merge", func(c *Core, now time.Time) (*Proposal, error) {
		return c.Merge(sliceRef(req.GetLeft()), sliceRef(req.GetRight()), now)
	})
	if err != nil {
		return nil, err
	}
	return &pb.MergeResponse{Change: ch}, nil
}

func (a *api) Pin(ctx context.Context, req *pb.PinRequest) (*pb.PinResponse, error) {
	if err := checkRef("slice", req.GetSlice()); err != nil {
		return nil, a.toStatus(err)
	}
	res, p, err := a.call(ctx, "pin", func(c *Core, _ time.Time) (*Proposal, any, error) {
		p, r, err := c.Pin(sliceRef(req.GetSlice()))
		return p, r, err
	})
	if err != nil {
		return nil, err
	}
	return &pb.PinResponse{Pinned: wire.RangeToProto(res.(keyspace.Range)), Already: !p.Persists()}, nil
}

func (a *api) Unpin(ctx context.Context, req *pb.UnpinRequest) (*pb.UnpinResponse, error) {
	if err := checkRef("slice", req.GetSlice()); err != nil {
		return nil, a.toStatus(err)
	}
	res, p, err := a.call(ctx, "unpin", func(c *Core, _ time.Time) (*Proposal, any, error) {
		p, r, err := c.Unpin(sliceRef(req.GetSlice()))
		return p, r, err
	})
	if err != nil {
		return nil, err
	}
	return &pb.UnpinResponse{Unpinned: wire.RangeToProto(res.(keyspace.Range)), Already: !p.Persists()}, nil
}

func (a *api) Drain(ctx context.Context, req *pb.DrainRequest) (*pb.DrainResponse, error) {
	if err := wire.CheckNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, a.toStatus(err)
	}
	res, _, err := a.call(ctx, "drain", func(c *Core, _ time.Time) (*Proposal, any, error) {
		p, held, err := c.Drain(assignment.NodeID(req.GetNodeId()), req.GetCancel())
		return p, held, err
	})
	if err != nil {
		return nil, err
	}
	return &pb.DrainResponse{Slices: uint32(res.(int))}, nil
}

func (a *api) Freeze(ctx context.Context, req *pb.FreezeRequest) (*pb.FreezeResponse, error) {
	if err := wire.CheckString("reason", req.GetReason(), maxReasonBytes); err != nil {
		return nil, a.toStatus(err)
	}
	if _, _, err := a.call(ctx, "freeze", func(c *Core, _ time.Time) (*Proposal, any, error) { return c.Freeze(req.GetReason()), nil, nil }); err != nil {
		return nil, err
	}
	return &pb.FreezeResponse{}, nil
}

func (a *api) Unfreeze(ctx context.Context, _ *pb.UnfreezeRequest) (*pb.UnfreezeResponse, error) {
	if _, _, err := a.call(ctx, "unfreeze", func(c *Core, _ time.Time) (*Proposal, any, error) { return c.Unfreeze(), nil, nil }); err != nil {
		return nil, err
	}
	return &pb.UnfreezeResponse{}, nil
}

func (a *api) SetAlgorithm(ctx context.Context, req *pb.SetAlgorithmRequest) (*pb.SetAlgorithmResponse, error) {
	if err := checkAlgorithm(req.GetName(), req.GetParams()); err != nil {
		return nil, a.toStatus(err)
	}
	if _, _, err := a.call(ctx, "set_algorithm", func(c *Core, _ time.Time) (*Proposal, any, error) {
		p, err := c.SetAlgorithm(req.GetName(), req.GetParams())
		return p, nil, err
	}); err != nil {
		return nil, err
	}
	return &pb.SetAlgorithmResponse{}, nil
}

func (a *api) Explain(ctx context.Context, _ *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	type result struct {
		x        balance.Explanation
		ok       bool
		pos      quantum.Position
		failures uint64
		failure  string
		failedAt time.Time
	}
	res, _, err := a.call(ctx, "explain", func(c *Core, _ time.Time) (*Proposal, any, error) {
		x, ok := c.Explain()
		_, pos, _ := c.Assignment()
		r := result{x: x, ok: ok, pos: pos}
		r.failures, r.failure, r.failedAt = c.PassFailures()
		return nil, r, nil
	})
	if err != nil {
		return nil, err
	}
	r := res.(result)
	out := &pb.ExplainResponse{Position: wire.PositionToProto(r.pos), PassFailures: r.failures, PassError: r.failure}
	if !r.failedAt.IsZero() {
		out.PassErrorTime = timestamppb.New(r.failedAt)
	}
	if !r.ok {
		return out, nil
	}
	x := r.x
	*out = pb.ExplainResponse{
		PassFailures: out.PassFailures, PassError: out.PassError, PassErrorTime: out.PassErrorTime,
		Passed: true, Position: out.Position, Algorithm: x.Algorithm,
		ImbalanceBefore: x.ImbalanceBefore, ImbalanceAfter: x.ImbalanceAfter, ChurnBudget: x.ChurnBudget,
		ChurnCleanup: x.Churn.Cleanup, ChurnMerge: x.Churn.Merge, ChurnMove: x.Churn.Move,
		Splits: uint32(x.Splits), Merges: uint32(x.Merges), Moves: uint32(x.Moves),
		ReplicasAdded: uint32(x.ReplicasAdded), ReplicasRemoved: uint32(x.ReplicasRemoved), Reassigned: uint32(x.Reassigned),
		Stop: x.Stop,
	}
	for _, c := range x.Candidates {
		out.Candidates = append(out.Candidates, &pb.Candidate{Action: c.Action, Slice: wire.RangeToProto(c.Slice),
			From: string(c.From), To: nodeStrings(c.To), Gain: c.Gain, Cost: c.Cost, Chosen: c.Chosen, Reason: c.Reason})
	}
	return out, nil
}

// checkAlgorithm bounds an algorithm's name and constants; their meaning is for
// balance.New to judge.
func checkAlgorithm(name string, params map[string]string) error {
	if len(params) > maxParams {
		return fmt.Errorf("%w: %d params; at most %d", wire.ErrInvalid, len(params), maxParams)
	}
	errs := []error{wire.CheckString("name", name, maxParamBytes)}
	for k, v := range params {
		errs = append(errs, wire.CheckString("params key", k, maxParamBytes), wire.CheckString("params value", v, maxParamBytes))
	}
	return errors.Join(errs...)
}

func nodeStrings(ids []assignment.NodeID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = string(id)
	}
	return out
}
