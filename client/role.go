package client

import (
	"fmt"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// The role models of a cluster (the assigner's --roles), for MemberConfig.Roles.
const (
	// RolesReplicas: every replica of a range is alike, the default. A member holds each
	// of its ranges as RoleReplica.
	RolesReplicas = assignment.RolesReplicas
	// RolesPrimarySecondary: one replica of each range is its primary, which takes its
	// writes, and the others are secondaries. A member holds each of its ranges as
	// RolePrimary or RoleSecondary.
	RolesPrimarySecondary = assignment.RolesPrimarySecondary
)

// Role is what a member is for a range it holds.
type Role uint8

const (
	// RoleReplica: every replica of the range is alike (the cluster's default). Routers
	// spread reads over the replicas; which of them takes writes, if the application has
	// any, is the application's business.
	RoleReplica Role = iota + 1
	// RolePrimary: the one replica of the range that takes its writes. The map names at
	// most one primary per range at any time; a planned move of the role waits until the
	// old primary's application has demoted itself (ChangeRole to RoleSecondary) before the
	// new one is promoted.
	RolePrimary
	// RoleSecondary: a replica that serves reads and takes no writes.
	RoleSecondary
)

func (r Role) String() string {
	switch r {
	case RoleReplica:
		return "replica"
	case RolePrimary:
		return "primary"
	case RoleSecondary:
		return "secondary"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// roleOf returns the role node id has in slice s of a cluster with primaries or without.
// A primary handing the role over (Next set) is a secondary already: it stops taking writes.
func roleOf(s assignment.Slice, id assignment.NodeID, primaries bool) Role {
	switch {
	case !primaries:
		return RoleReplica
	case s.IsPrimary(id):
		return RolePrimary
	}
	return RoleSecondary
}
