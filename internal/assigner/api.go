package assigner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner/etcdstate"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/mapserve"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// UserMetadata is the gRPC metadata key in which a client says who it acts for (slicectl
// sends the operator's login). It is a claim, not an identity: anyone can send any value, so
// the audit trail records the caller authz authenticated (authz.Caller) and logs this only
// beside it, as "claims".
const UserMetadata = "x-sliceplane-user"

// api implements the gRPC services of one target (dispatch finds it).
type api struct {
	s     *served
	maps  *mapserve.Server // the leader's map, from the hub of its term
	fresh *freshness
	gate  *reportGate
}

// leader returns the leadership, or a status that says where the leader is.
func (a *api) leader() (*leadership, error) {
	if l := a.s.leading.Load(); l != nil {
		return l, nil
	}
	return nil, a.notLeader()
}

// feed returns the leader's feed, for the map's service.
func (a *api) feed() (*mapserve.Feed, error) {
	l, err := a.leader()
	if err != nil {
		return nil, err
	}
	return l.feed, nil
}

func (a *api) notLeader() error {
	if addr := a.s.leader(); addr != "" {
		return status.Errorf(codes.Unavailable, "assigner: not the leader; the leader is at %s", addr)
	}
	return status.Error(codes.Unavailable, "assigner: not the leader, and no leader is known yet")
}

// toStatus maps an error of the core or the store to a gRPC status.
func (a *api) toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, core.ErrNotLeader), errors.Is(err, etcdstate.ErrFenced):
		return a.notLeader()
	case errors.Is(err, core.ErrUnknownNode):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, core.ErrInvalid), errors.Is(err, wire.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, core.ErrPrecondition):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	// What is left comes from etcd: most likely passing.
	return status.Error(codes.Unavailable, err.Error())
}

// caller says who makes the call of ctx, for the audit trail.
func caller(ctx context.Context) core.Caller {
	var claims string
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(UserMetadata)) > 0 {
		claims = md.Get(UserMetadata)[0]
	}
	return core.Caller{Who: authz.Caller(ctx), Claims: claims}
}

// call steps ev in the leader's loop and maps its error: err is the leader's failure to
// step it or the core's verdict, which the reply's Err holds alone.
func (a *api) call(ctx context.Context, ev core.Event) (core.Reply, error) {
	l, err := a.leader()
	if err != nil {
		return core.Reply{}, err
	}
	rep, err := l.do(ctx, ev)
	if err == nil {
		err = rep.Err
	}
	if name := core.Call(ev); core.IsAdmin(name) {
		result := "ok"
		if err != nil {
			result = "refused"
		}
		a.s.metrics.adminChanges.WithLabelValues(name, result).Inc()
	}
	return rep, a.toStatus(err)
}

// changeToProto describes a persisted admin change.
func changeToProto(c *core.Change) *pb.Change {
	if c == nil {
		return &pb.Change{}
	}
	return &pb.Change{Summary: c.Summary, Position: wire.PositionToProto(c.Position), Generation: c.Generation,
		Ops: wire.OpsToProto(c.Ops)}
}

// AssignmentService

func (a *api) WatchAssignment(req *pb.WatchAssignmentRequest, stream pb.AssignmentService_WatchAssignmentServer) error {
	return a.maps.Watch(stream, mapserve.Want{From: req.GetFrom(), Heartbeat: req.GetHeartbeat()})
}

func (a *api) GetAssignment(context.Context, *pb.GetAssignmentRequest) (*pb.GetAssignmentResponse, error) {
	return a.maps.GetAssignment()
}

func (a *api) Lookup(_ context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	return a.maps.Lookup(req)
}

// QuantaService

func (a *api) WatchQuanta(req *pb.WatchQuantaRequest, stream pb.QuantaService_WatchQuantaServer) error {
	return a.maps.Watch(stream, mapserve.Want{From: req.GetFrom(), ClockQuanta: true})
}

// NodeService

func (a *api) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	n, err := wire.NodeFromProto(req.GetNode())
	if err != nil {
		return nil, a.toStatus(err)
	}
	rec := core.Node{Node: n, Address: req.GetAddress(), Labels: maps.Clone(req.GetLabels()), Roles: req.GetRoles(),
		Incarnation: req.GetIncarnation()}
	rep, err := a.call(ctx, core.Register{Caller: caller(ctx), Node: rec})
	if err != nil {
		return nil, err
	}
	return &pb.RegisterResponse{Ttl: durationpb.New(rep.TTL), Distributor: distributor(rep.Distributor), Lease: optDuration(rep.Lease),
		Generation: rep.Generation}, nil
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
	hb := core.Heartbeat{Caller: caller(ctx), Node: id, Generation: req.GetGeneration()}
	var err error
	if hb.Loading, err = heartbeatRanges("loading", req.GetLoading()); err != nil {
		return nil, err
	}
	if hb.Primaries, err = heartbeatRanges("primary", req.GetPrimaries()); err != nil {
		return nil, err
	}
	hb.Tokens = req.GetPrimaryTokens()
	if hb.Report, err = a.heartbeatLoad(id, req.GetLoad()); err != nil {
		return nil, err
	}
	if hb.Report != nil && !a.gate.allow(id) {
		a.countRefused("rate") // the heartbeat itself goes on: it keeps the member's lease
		hb.Report = nil
	}
	rep, err := a.call(ctx, hb)
	if hb.Report != nil {
		a.countReport(rep, err)
	}
	if err != nil {
		return nil, err
	}
	a.fresh.record(id, req.GetStale(), silence, a.s.now(), a.s.coreCfg.Load().NodeTTL)
	return &pb.HeartbeatResponse{Ttl: durationpb.New(rep.TTL), Draining: rep.Draining, Distributor: distributor(rep.Distributor),
		Lease: optDuration(rep.Lease), Generation: rep.Generation}, nil
}

// heartbeatLoad decodes the load report a heartbeat of node id carries: nil for none.
func (a *api) heartbeatLoad(id assignment.NodeID, req *pb.ReportLoadRequest) (*load.Report, error) {
	if req == nil {
		return nil, nil
	}
	if named := req.GetNodeId(); named != "" && named != string(id) {
		a.countRefused("malformed")
		return nil, status.Errorf(codes.InvalidArgument, "assigner: heartbeat of %s: its load names node %q", id, named)
	}
	r, err := wire.ReportFromProto(req)
	if err != nil {
		a.countRefused("malformed")
		return nil, a.toStatus(fmt.Errorf("heartbeat: load: %w", err))
	}
	r.Node = id
	return &r, nil
}

// optDuration encodes d, nil for 0.
func optDuration(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// heartbeatRanges decodes the ranges a heartbeat lists as what (loading, primary).
func heartbeatRanges(what string, ms []*pb.Range) ([]keyspace.Range, error) {
	if len(ms) > maxLoadingRanges {
		return nil, status.Errorf(codes.InvalidArgument, "assigner: heartbeat lists %d %s ranges; at most %d", len(ms), what, maxLoadingRanges)
	}
	out := make([]keyspace.Range, 0, len(ms))
	for i, m := range ms {
		r, err := wire.RangeFromProto(m)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "assigner: heartbeat: %s range %d: %v", what, i, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// distributor says which distributor serves a node, or nil while there is none.
func distributor(d *core.Distributor) *pb.Distributor {
	if d == nil {
		return nil
	}
	return &pb.Distributor{Id: d.ID, Address: d.Address}
}

func (a *api) Deregister(ctx context.Context, req *pb.DeregisterRequest) (*pb.DeregisterResponse, error) {
	if err := wire.CheckNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, a.toStatus(err)
	}
	grace := req.GetGrace().AsDuration()
	if req.GetGrace() != nil && (grace <= 0 || req.GetGrace().CheckValid() != nil) {
		return nil, status.Errorf(codes.InvalidArgument, "assigner: grace %s: want > 0", grace)
	}
	if _, err := a.call(ctx, core.Deregister{Caller: caller(ctx), Node: assignment.NodeID(req.GetNodeId()), Grace: grace}); err != nil {
		return nil, err
	}
	return &pb.DeregisterResponse{}, nil
}

func (a *api) ReportLoad(ctx context.Context, req *pb.ReportLoadRequest) (*pb.ReportLoadResponse, error) {
	r, err := wire.ReportFromProto(req)
	if err != nil {
		a.countRefused("malformed")
		return nil, a.toStatus(err)
	}
	if !a.gate.allow(r.Node) {
		a.countRefused("rate")
		return nil, status.Errorf(codes.ResourceExhausted, "assigner: node %s reports more than %.3g times a second; this report was dropped",
			r.Node, float64(a.gate.every))
	}
	rep, err := a.call(ctx, core.ReportLoad{Caller: caller(ctx), Report: r})
	a.countReport(rep, err)
	if err != nil {
		return nil, err
	}
	return &pb.ReportLoadResponse{}, nil
}

// countRefused counts a load report refused before the core saw it, for reason: malformed,
// or rate (over its member's reports a second, dropped).
func (a *api) countRefused(reason string) {
	a.s.metrics.reports.WithLabelValues("rejected").Inc()
	a.s.metrics.reportsRejected.WithLabelValues(reason).Inc()
}

// countReport counts a load report the core was asked to take, by its answer: rep.Err is
// the core's verdict, err also a failure to reach it.
func (a *api) countReport(rep core.Reply, err error) {
	result := "accepted"
	if err != nil {
		result = "rejected"
	}
	a.s.metrics.reports.WithLabelValues(result).Inc()
	if rep.Err != nil {
		a.s.metrics.reportsRejected.WithLabelValues(rejectReason(rep.Err)).Inc()
	}
}

// rejectReason names why the core refused a report, for the metric's bounded label.
func rejectReason(err error) string {
	if errors.Is(err, core.ErrUnknownNode) {
		return "unknown_node"
	}
	return load.Reason(err)
}

// AdminService

func (a *api) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	leaderAddr := a.s.leader()
	if a.s.leading.Load() == nil {
		return &pb.StatusResponse{Leader: false, LeaderAddress: leaderAddr}, nil
	}
	rep, err := a.call(ctx, core.GetStatus{Caller: caller(ctx)})
	if err != nil {
		return nil, err
	}
	st := rep.Status
	out := &pb.StatusResponse{
		Leader: true, LeaderAddress: a.s.cfg.Advertise, Position: wire.PositionToProto(st.Position), Clock: st.Clock,
		Generation: st.Generation, Imbalance: st.Imbalance, Slices: uint32(st.Slices), Nodes: uint32(st.Nodes),
		Frozen: st.Frozen, Algorithm: st.Algorithm, Params: st.Params,
		Roles: st.Roles, Exclusive: st.Exclusive, NodeTtl: durationpb.New(st.NodeTTL), MinReplicas: uint32(st.MinReplicas),
	}
	if !st.LastPass.IsZero() {
		out.LastPass = timestamppb.New(st.LastPass)
	}
	out.PassFailures, out.PassError, out.Handoffs = st.PassFailures, st.PassError, uint32(st.Handoffs)
	if !st.PassErrorTime.IsZero() {
		out.PassErrorTime = timestamppb.New(st.PassErrorTime)
	}
	if st.SourceError != "" {
		out.SourceError, out.SourceLostSince = st.SourceError, timestamppb.New(st.SourceLostSince)
		out.SourceMisconfigured = st.SourceMisconfigured
	}
	for _, r := range st.Pinned {
		out.Pinned = append(out.Pinned, wire.RangeToProto(r))
	}
	out.Quarantined = quarantinesToProto(st.Quarantined)
	return out, nil
}

// quarantinesToProto converts the quarantined ranges of Status and Explain.
func quarantinesToProto(qs []core.Quarantine) []*pb.Quarantine {
	var out []*pb.Quarantine
	for _, q := range qs {
		out = append(out, &pb.Quarantine{Range: wire.RangeToProto(q.Range), Since: timestamppb.New(q.Since), Nodes: nodeStrings(q.Nodes)})
	}
	return out
}

func (a *api) ListNodes(ctx context.Context, _ *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	rep, err := a.call(ctx, core.ListNodes{Caller: caller(ctx)})
	if err != nil {
		return nil, err
	}
	out := &pb.ListNodesResponse{}
	now := time.Now()
	for _, n := range rep.Nodes {
		info := &pb.NodeInfo{Node: wire.NodeToProto(n.Node.Node), Address: n.Address, Labels: n.Labels,
			Draining: n.Draining, Slices: uint32(n.Slices), Load: n.Load, LastSeen: timestamppb.New(n.LastSeen),
			Loading: uint32(n.Loading), Primaries: uint32(n.Primaries), Roles: n.Roles, Idle: n.Idle}
		if f, ok := a.fresh.of(n.Node.ID, now, a.s.coreCfg.Load().NodeTTL); ok {
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
	rep, err := a.call(ctx, core.ListSlices{Caller: caller(ctx), Node: assignment.NodeID(req.GetNode()), ByLoad: req.GetByLoad(), Limit: limit})
	if err != nil {
		return nil, err
	}
	out := &pb.ListSlicesResponse{Total: uint32(rep.Total)}
	for _, s := range rep.Slices {
		out.Slices = append(out.Slices, &pb.SliceInfo{Range: wire.RangeToProto(s.Range), Replicas: nodeStrings(s.Replicas),
			Load: s.Load, Keys: s.Keys, Pinned: s.Pinned, Loading: nodeStrings(s.Loading), Leaving: nodeStrings(s.Leaving), Since: s.Since,
			Primary: string(s.Primary), Next: string(s.Next), Token: s.Token})
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
	for _, q := range l.feed.Hub().Recent(limit, req.GetIncludeClock()) {
		p := wire.QuantumToProto(q)
		p.Assignment = nil // the whole map is not history; GetAssignment gives it
		out.Quanta = append(out.Quanta, p)
	}
	return out, nil
}

// Bounds on admin requests' fields, so that no request makes the assigner store, compute or
// echo without limit.
const (
	maxKeyBytes = 4096 // a key naming a slice
	maxReplicas = 64   // nodes a move names
	// maxLoadingRanges bounds the ranges a heartbeat lists as loading: a node lists each
	// slice it is still loading, and the core checks them against its slices in handoff.
	maxLoadingRanges = 1 << 16
	maxReasonBytes   = 1024 // a freeze's reason
	maxParams        = 32   // an algorithm's constants
	maxParamBytes    = 64   // an algorithm's name, a constant's name or value
	maxListQuanta    = 10000
	maxListedSlices  = 1 << 20
)

// checkRef bounds a slice reference.
func checkRef(field string, r *pb.SliceRef) error {
	return wire.CheckString(field+".key", string(r.GetKey()), maxKeyBytes)
}

func sliceRef(r *pb.SliceRef) core.SliceRef {
	switch v := r.GetRef().(type) {
	case *pb.SliceRef_Start:
		return core.SliceRef{Start: &v.Start}
	case *pb.SliceRef_Key:
		return core.SliceRef{Key: v.Key}
	case *pb.SliceRef_Hash:
		return core.SliceRef{Hash: &v.Hash}
	}
	return core.SliceRef{}
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
	rep, err := a.call(ctx, core.Move{Caller: caller(ctx), Slice: sliceRef(req.GetSlice()), To: to})
	if err != nil {
		return nil, err
	}
	return &pb.MoveResponse{Change: changeToProto(rep.Change)}, nil
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
	rep, err := a.call(ctx, core.Split{Caller: caller(ctx), Slice: ref, At: at})
	if err != nil {
		return nil, err
	}
	return &pb.SplitResponse{Change: changeToProto(rep.Change)}, nil
}

func (a *api) Merge(ctx context.Context, req *pb.MergeRequest) (*pb.MergeResponse, error) {
	if err := errors.Join(checkRef("left", req.GetLeft()), checkRef("right", req.GetRight())); err != nil {
		return nil, a.toStatus(err)
	}
	rep, err := a.call(ctx, core.Merge{Caller: caller(ctx), Left: sliceRef(req.GetLeft()), Right: sliceRef(req.GetRight())})
	if err != nil {
		return nil, err
	}
	return &pb.MergeResponse{Change: changeToProto(rep.Change)}, nil
}

func (a *api) Pin(ctx context.Context, req *pb.PinRequest) (*pb.PinResponse, error) {
	if err := checkRef("slice", req.GetSlice()); err != nil {
		return nil, a.toStatus(err)
	}
	rep, err := a.call(ctx, core.Pin{Caller: caller(ctx), Slice: sliceRef(req.GetSlice())})
	if err != nil {
		return nil, err
	}
	return &pb.PinResponse{Pinned: wire.RangeToProto(rep.Range), Already: !rep.Change.Persisted}, nil
}

func (a *api) Unpin(ctx context.Context, req *pb.UnpinRequest) (*pb.UnpinResponse, error) {
	if err := checkRef("slice", req.GetSlice()); err != nil {
		return nil, a.toStatus(err)
	}
	rep, err := a.call(ctx, core.Unpin{Caller: caller(ctx), Slice: sliceRef(req.GetSlice())})
	if err != nil {
		return nil, err
	}
	return &pb.UnpinResponse{Unpinned: wire.RangeToProto(rep.Range), Already: !rep.Change.Persisted}, nil
}

func (a *api) Unquarantine(ctx context.Context, req *pb.UnquarantineRequest) (*pb.UnquarantineResponse, error) {
	if err := checkRef("slice", req.GetSlice()); err != nil {
		return nil, a.toStatus(err)
	}
	rep, err := a.call(ctx, core.Unquarantine{Caller: caller(ctx), Slice: sliceRef(req.GetSlice())})
	if err != nil {
		return nil, err
	}
	return &pb.UnquarantineResponse{Lifted: wire.RangeToProto(rep.Range), Already: !rep.Change.Persisted}, nil
}

func (a *api) Drain(ctx context.Context, req *pb.DrainRequest) (*pb.DrainResponse, error) {
	if err := wire.CheckNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, a.toStatus(err)
	}
	rep, err := a.call(ctx, core.Drain{Caller: caller(ctx), Node: assignment.NodeID(req.GetNodeId()), Cancel: req.GetCancel()})
	if err != nil {
		return nil, err
	}
	a.s.view.Drain(time.Now(), req.GetNodeId(), req.GetCancel(), authz.Caller(ctx))
	return &pb.DrainResponse{Slices: uint32(rep.Held)}, nil
}

// nodeAPI is the NodeService: its Drain, a node's own, differs from the AdminService's.
type nodeAPI struct{ *api }

// Drain steps the drain an admin would ask for; the authz rules let a node ask only for
// itself.
func (a nodeAPI) Drain(ctx context.Context, req *pb.NodeServiceDrainRequest) (*pb.NodeServiceDrainResponse, error) {
	resp, err := a.api.Drain(ctx, &pb.DrainRequest{NodeId: req.GetNodeId(), Cancel: req.GetCancel()})
	if err != nil {
		return nil, err
	}
	return &pb.NodeServiceDrainResponse{Slices: resp.GetSlices()}, nil
}

func (a *api) Freeze(ctx context.Context, req *pb.FreezeRequest) (*pb.FreezeResponse, error) {
	if err := wire.CheckString("reason", req.GetReason(), maxReasonBytes); err != nil {
		return nil, a.toStatus(err)
	}
	if _, err := a.call(ctx, core.Freeze{Caller: caller(ctx), Reason: req.GetReason()}); err != nil {
		return nil, err
	}
	return &pb.FreezeResponse{}, nil
}

func (a *api) Unfreeze(ctx context.Context, _ *pb.UnfreezeRequest) (*pb.UnfreezeResponse, error) {
	if _, err := a.call(ctx, core.Unfreeze{Caller: caller(ctx)}); err != nil {
		return nil, err
	}
	return &pb.UnfreezeResponse{}, nil
}

func (a *api) SetAlgorithm(ctx context.Context, req *pb.SetAlgorithmRequest) (*pb.SetAlgorithmResponse, error) {
	if err := checkAlgorithm(req.GetName(), req.GetParams()); err != nil {
		return nil, a.toStatus(err)
	}
	if _, err := a.call(ctx, core.SetAlgorithm{Caller: caller(ctx), Name: req.GetName(), Params: req.GetParams()}); err != nil {
		return nil, err
	}
	return &pb.SetAlgorithmResponse{}, nil
}

func (a *api) Explain(ctx context.Context, _ *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	rep, err := a.call(ctx, core.GetExplain{Caller: caller(ctx)})
	if err != nil {
		return nil, err
	}
	return ExplainToProto(*rep.Explain), nil
}

// ExplainToProto converts the explanation of the last pass, for Explain and the web view.
func ExplainToProto(r core.Explanation) *pb.ExplainResponse {
	out := &pb.ExplainResponse{Position: wire.PositionToProto(r.Position), PassFailures: r.Failures, PassError: r.Error,
		Quarantined: quarantinesToProto(r.Quarantined)}
	if !r.ErrorTime.IsZero() {
		out.PassErrorTime = timestamppb.New(r.ErrorTime)
	}
	if !r.Passed {
		return out
	}
	x := r.Explanation
	*out = pb.ExplainResponse{
		PassFailures: out.PassFailures, PassError: out.PassError, PassErrorTime: out.PassErrorTime, Quarantined: out.Quarantined,
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
	return out
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
