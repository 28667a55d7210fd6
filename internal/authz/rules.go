package authz

import (
	"strings"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// Rule says who may call a method.
type Rule struct {
	// Roles may call the method (any one of them).
	Roles []Role
	// Public lets every authenticated identity call it (health, reflection).
	Public bool
	// Self, for a method a node calls about itself, returns the node a request message
	// names (false for a message that names none); a caller allowed only by its node role
	// must be that node.
	Self func(msg any) (string, bool)
	// Unconfined refuses identities confined to a target: the method acts on every target
	// (the registry of targets).
	Unconfined bool
}

// Rules maps full method names (/package.Service/Method) to their rules; a name ending in
// "/*" covers a whole service. A method with no rule is refused: closed by default.
type Rules map[string]Rule

func (r Rules) find(method string) (Rule, bool) {
	if rule, ok := r[method]; ok {
		return rule, true
	}
	if i := strings.LastIndex(method, "/"); i > 0 {
		rule, ok := r[method[:i]+"/*"]
		return rule, ok
	}
	return Rule{}, false
}

// public are the services every authenticated identity may call: health (how clients find
// the leading assigner, and probes) and reflection (grpcurl).
func public(r Rules) Rules {
	r["/"+healthpb.Health_ServiceDesc.ServiceName+"/*"] = Rule{Public: true}
	r["/grpc.reflection.v1.ServerReflection/*"] = Rule{Public: true}
	r["/grpc.reflection.v1alpha.ServerReflection/*"] = Rule{Public: true}
	return r
}

// nodeID names the node of requests that carry a node_id.
func nodeID(msg any) (string, bool) {
	switch m := msg.(type) {
	case *pb.RegisterRequest:
		return m.GetNode().GetId(), true
	case interface{ GetNodeId() string }:
		return m.GetNodeId(), true
	case *pb.PullRequest:
		if s := m.GetStart(); s != nil {
			return s.GetNodeId(), true
		}
	}
	return "", false
}

func methods(desc string, names []string, rule Rule, into Rules) {
	for _, n := range names {
		into["/"+desc+"/"+n] = rule
	}
}

// AssignerRules are the rules of the assigner's services.
func AssignerRules() Rules {
	r := Rules{}
	methods(pb.NodeService_ServiceDesc.ServiceName, []string{"Register", "Heartbeat", "Deregister", "ReportLoad", "Drain"},
		Rule{Roles: []Role{RoleNode}, Self: nodeID}, r)
	methods(pb.AssignmentService_ServiceDesc.ServiceName, []string{"WatchAssignment", "GetAssignment", "Lookup"},
		Rule{Roles: []Role{RoleRouter}}, r)
	// Routers read the nodes' addresses, which the map does not carry.
	methods(pb.AdminService_ServiceDesc.ServiceName, []string{"ListNodes"}, Rule{Roles: []Role{RoleRouter}}, r)
	methods(pb.QuantaService_ServiceDesc.ServiceName, []string{"WatchQuanta"}, Rule{Roles: []Role{RoleDistributor}}, r)
	methods(pb.AdminService_ServiceDesc.ServiceName, []string{"Status", "ListSlices", "ListQuanta", "Explain"},
		Rule{Roles: []Role{RoleViewer}}, r)
	methods(pb.AdminService_ServiceDesc.ServiceName,
		[]string{"Move", "Split", "Merge", "Pin", "Unpin", "Unquarantine", "Drain", "Freeze", "Unfreeze", "SetAlgorithm"},
		Rule{Roles: []Role{RoleAdmin}}, r)
	methods(pb.TargetService_ServiceDesc.ServiceName, []string{"ListTargets"}, Rule{Roles: []Role{RoleViewer}, Unconfined: true}, r)
	methods(pb.TargetService_ServiceDesc.ServiceName, []string{"CreateTarget", "UpdateTarget", "DeleteTarget"},
		Rule{Roles: []Role{RoleAdmin}, Unconfined: true}, r)
	return public(r)
}

// DistributorRules are the rules of the distributor's service.
func DistributorRules() Rules {
	r := Rules{}
	methods(pb.DistributorService_ServiceDesc.ServiceName, []string{"Pull"}, Rule{Roles: []Role{RoleNode}, Self: nodeID}, r)
	// A distributor relays the map and the node list to routers and members (package relay).
	methods(pb.AssignmentService_ServiceDesc.ServiceName, []string{"WatchAssignment", "GetAssignment", "Lookup"},
		Rule{Roles: []Role{RoleRouter}}, r)
	methods(pb.AdminService_ServiceDesc.ServiceName, []string{"ListNodes"}, Rule{Roles: []Role{RoleRouter}}, r)
	return public(r)
}
