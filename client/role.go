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

// Grant is what a member holds a range as: its Role and, for a primary, the fencing Token
// of the grant. The token only grows for any point of the space (a later grant of the
// primary role, wherever the range was split or merged and whoever led the assigners, has
// a higher one), so that a store the application writes through can refuse a write of a
// primary that lost the role without knowing it (paused, cut off): see client/fence. A
// primary's grant changes (ChangeRole) when its token does, after a merge for one.
type Grant struct {
	Role  Role
	Token uint64
}

func (g Grant) String() string {
	if g.Role == RolePrimary {
		return fmt.Sprintf("primary (token %d)", g.Token)
	}
	return g.Role.String()
}

// grantOf returns the grant node id has in slice s of a cluster of role model roles; leased
// says whether it may act as a primary now (its lease, in an exclusive cluster). A primary
// handing the role over (Next set) is a secondary already: it stops taking writes.
func grantOf(roles assignment.RoleModel, s assignment.Slice, id assignment.NodeID, leased bool) Grant {
	switch {
	case !roles.Primaries:
		return Grant{Role: RoleReplica}
	case s.IsPrimary(id) && leased:
		return Grant{Role: RolePrimary, Token: s.Token}
	}
	return Grant{Role: RoleSecondary}
}
