package assigner

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/target/registry"
)

// targetAPI is the TargetService: the registry of targets, which any assigner serves.
type targetAPI struct {
	pb.UnimplementedTargetServiceServer
	s *Server
}

func (a targetAPI) ListTargets(ctx context.Context, _ *pb.ListTargetsRequest) (*pb.ListTargetsResponse, error) {
	recs, _, err := a.s.registry.List(ctx)
	if err != nil {
		return nil, targetStatus(err)
	}
	out := &pb.ListTargetsResponse{Targets: []*pb.Target{a.toProto(registry.Record{Name: target.Default})}}
	for _, r := range recs {
		out.Targets = append(out.Targets, a.toProto(r))
	}
	return out, nil
}

func (a targetAPI) CreateTarget(ctx context.Context, req *pb.CreateTargetRequest) (*pb.CreateTargetResponse, error) {
	t, err := a.put(ctx, req.GetName(), req.GetConfig(), true)
	if err != nil {
		return nil, err
	}
	return &pb.CreateTargetResponse{Target: t}, nil
}

func (a targetAPI) UpdateTarget(ctx context.Context, req *pb.UpdateTargetRequest) (*pb.UpdateTargetResponse, error) {
	t, err := a.put(ctx, req.GetName(), req.GetConfig(), false)
	if err != nil {
		return nil, err
	}
	return &pb.UpdateTargetResponse{Target: t}, nil
}

// put checks the config against this assigner's flags, as the assigner that will lead the
// target applies it, and writes it.
func (a targetAPI) put(ctx context.Context, name, config string, create bool) (*pb.Target, error) {
	c, err := registry.Parse([]byte(config))
	if err == nil { // the name is the registry's to check (Put)
		_, err = c.Apply(*a.s.cfg.rawCore)
	}
	if err != nil {
		return nil, targetStatus(err)
	}
	rec := registry.Record{Name: name, Config: c, Changed: a.change(ctx, map[bool]string{true: "create", false: "update"}[create])}
	if err := a.s.registry.Put(ctx, rec, create); err != nil {
		return nil, targetStatus(err)
	}
	a.s.log.Info("audit: target "+rec.Changed.Action, "target", name, "by", rec.Changed.By, "claims", rec.Changed.Claims)
	return a.toProto(rec), nil
}

func (a targetAPI) DeleteTarget(ctx context.Context, req *pb.DeleteTargetRequest) (*pb.DeleteTargetResponse, error) {
	c := a.change(ctx, "delete")
	if err := a.s.registry.Delete(ctx, req.GetName(), req.GetForce(), c); err != nil {
		return nil, targetStatus(err)
	}
	a.s.log.Info("audit: target delete", "target", req.GetName(), "by", c.By, "claims", c.Claims, "force", req.GetForce())
	return &pb.DeleteTargetResponse{}, nil
}

func (a targetAPI) change(ctx context.Context, action string) registry.Change {
	who := caller(ctx)
	return registry.Change{Action: action, By: who.Who, Claims: who.Claims, At: time.Now()}
}

func (a targetAPI) toProto(r registry.Record) *pb.Target {
	out := &pb.Target{Name: r.Name, Config: string(r.Config.Redacted().Marshal()), ChangedBy: r.Changed.By, Action: r.Changed.Action}
	if r.Name == target.Default {
		out.Config = "# the assigner's flags\n"
	}
	if !r.Changed.At.IsZero() {
		out.ChangedAt = timestamppb.New(r.Changed.At)
	}
	if t, err := a.s.named(r.Name); err == nil {
		out.Leader = t.leader()
	}
	return out
}

// targetStatus maps an error of the registry to a gRPC status.
func targetStatus(err error) error {
	code := codes.Unavailable // etcd's, most likely passing
	switch {
	case errors.Is(err, target.ErrInvalid), errors.Is(err, registry.ErrDefaultFixed):
		code = codes.InvalidArgument
	case errors.Is(err, registry.ErrExists):
		code = codes.AlreadyExists
	case errors.Is(err, registry.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, registry.ErrHasMembers):
		code = codes.FailedPrecondition
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(code, "assigner: "+err.Error())
}
