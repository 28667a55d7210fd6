package assigner

import (
	"context"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// dispatch serves the target services of every target: each call goes to the api of the
// target its metadata names (Server.lookup), and a call to an unknown target is NotFound.
type dispatch struct {
	pb.UnimplementedAssignmentServiceServer
	pb.UnimplementedQuantaServiceServer
	pb.UnimplementedAdminServiceServer
	s *Server
}

// nodeDispatch is dispatch's NodeService, whose Drain differs from the AdminService's.
type nodeDispatch struct {
	pb.UnimplementedNodeServiceServer
	s *Server
}

// unary calls m on the api of ctx's target.
func unary[Req, Resp any](s *Server, ctx context.Context, req Req, m func(*api, context.Context, Req) (Resp, error)) (Resp, error) {
	t, err := s.lookup(ctx)
	if err != nil {
		var zero Resp
		return zero, err
	}
	return m(t.api, ctx, req)
}

// streaming calls m on the api of ctx's target.
func streaming(s *Server, ctx context.Context, m func(*api) error) error {
	t, err := s.lookup(ctx)
	if err != nil {
		return err
	}
	return m(t.api)
}

// AssignmentService

func (d dispatch) WatchAssignment(req *pb.WatchAssignmentRequest, stream pb.AssignmentService_WatchAssignmentServer) error {
	return streaming(d.s, stream.Context(), func(a *api) error { return a.WatchAssignment(req, stream) })
}

func (d dispatch) GetAssignment(ctx context.Context, req *pb.GetAssignmentRequest) (*pb.GetAssignmentResponse, error) {
	return unary(d.s, ctx, req, (*api).GetAssignment)
}

func (d dispatch) Lookup(ctx context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	return unary(d.s, ctx, req, (*api).Lookup)
}

// QuantaService

func (d dispatch) WatchQuanta(req *pb.WatchQuantaRequest, stream pb.QuantaService_WatchQuantaServer) error {
	return streaming(d.s, stream.Context(), func(a *api) error { return a.WatchQuanta(req, stream) })
}

// NodeService

func (d nodeDispatch) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	return unary(d.s, ctx, req, (*api).Register)
}

func (d nodeDispatch) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	return unary(d.s, ctx, req, (*api).Heartbeat)
}

func (d nodeDispatch) Deregister(ctx context.Context, req *pb.DeregisterRequest) (*pb.DeregisterResponse, error) {
	return unary(d.s, ctx, req, (*api).Deregister)
}

func (d nodeDispatch) ReportLoad(ctx context.Context, req *pb.ReportLoadRequest) (*pb.ReportLoadResponse, error) {
	return unary(d.s, ctx, req, (*api).ReportLoad)
}

func (d nodeDispatch) Drain(ctx context.Context, req *pb.NodeServiceDrainRequest) (*pb.NodeServiceDrainResponse, error) {
	return unary(d.s, ctx, req, func(a *api, ctx context.Context, req *pb.NodeServiceDrainRequest) (*pb.NodeServiceDrainResponse, error) {
		return nodeAPI{a}.Drain(ctx, req)
	})
}

// AdminService

func (d dispatch) Status(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	return unary(d.s, ctx, req, (*api).Status)
}

func (d dispatch) ListNodes(ctx context.Context, req *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	return unary(d.s, ctx, req, (*api).ListNodes)
}

func (d dispatch) ListSlices(ctx context.Context, req *pb.ListSlicesRequest) (*pb.ListSlicesResponse, error) {
	return unary(d.s, ctx, req, (*api).ListSlices)
}

func (d dispatch) ListQuanta(ctx context.Context, req *pb.ListQuantaRequest) (*pb.ListQuantaResponse, error) {
	return unary(d.s, ctx, req, (*api).ListQuanta)
}

func (d dispatch) Move(ctx context.Context, req *pb.MoveRequest) (*pb.MoveResponse, error) {
	return unary(d.s, ctx, req, (*api).Move)
}

func (d dispatch) Split(ctx context.Context, req *pb.SplitRequest) (*pb.SplitResponse, error) {
	return unary(d.s, ctx, req, (*api).Split)
}

func (d dispatch) Merge(ctx context.Context, req *pb.MergeRequest) (*pb.MergeResponse, error) {
	return unary(d.s, ctx, req, (*api).Merge)
}

func (d dispatch) Pin(ctx context.Context, req *pb.PinRequest) (*pb.PinResponse, error) {
	return unary(d.s, ctx, req, (*api).Pin)
}

func (d dispatch) Unpin(ctx context.Context, req *pb.UnpinRequest) (*pb.UnpinResponse, error) {
	return unary(d.s, ctx, req, (*api).Unpin)
}

func (d dispatch) Unquarantine(ctx context.Context, req *pb.UnquarantineRequest) (*pb.UnquarantineResponse, error) {
	return unary(d.s, ctx, req, (*api).Unquarantine)
}

func (d dispatch) Drain(ctx context.Context, req *pb.DrainRequest) (*pb.DrainResponse, error) {
	return unary(d.s, ctx, req, (*api).Drain)
}

func (d dispatch) Freeze(ctx context.Context, req *pb.FreezeRequest) (*pb.FreezeResponse, error) {
	return unary(d.s, ctx, req, (*api).Freeze)
}

func (d dispatch) Unfreeze(ctx context.Context, req *pb.UnfreezeRequest) (*pb.UnfreezeResponse, error) {
	return unary(d.s, ctx, req, (*api).Unfreeze)
}

func (d dispatch) SetAlgorithm(ctx context.Context, req *pb.SetAlgorithmRequest) (*pb.SetAlgorithmResponse, error) {
	return unary(d.s, ctx, req, (*api).SetAlgorithm)
}

func (d dispatch) Explain(ctx context.Context, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	return unary(d.s, ctx, req, (*api).Explain)
}
