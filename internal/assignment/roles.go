package assignment

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The role models a cluster may have (the assigner's --roles), as a participant registers
// the one it acts on.
const (
	// RolesReplicas: every replica of a slice is alike (the default).
	RolesReplicas = "replicas"
	// RolesPrimarySecondary: one replica of each slice is its primary, which takes its
	// writes; the others are secondaries.
	RolesPrimarySecondary = "primary-secondary"
)

// RoleModel is a cluster's role model (the assigner's --roles, a member's
// MemberConfig.Roles): the rules that differ between models live here, so that the assigner
// and the members ask the model instead of comparing its name. A new model is a value in
// roleModels, its rules here, and the scripts that show it.
type RoleModel struct {
	// Name is how flags, registrations and the wire say it.
	Name string
	// Primaries: one replica of each slice is its primary, which takes its writes, and the
	// others are secondaries; the assigner places the role and moves it in two steps (see
	// below). Without, every replica is alike.
	Primaries bool
	// Help says what the model does, for --roles.
	Help string
}

// The role models there are.
var (
	Replicas         = RoleModel{Name: RolesReplicas, Help: "all alike"}
	PrimarySecondary = RoleModel{Name: RolesPrimarySecondary, Primaries: true,
		Help: "one primary per slice takes its writes; a planned move of the role waits for the old primary to demote itself, or for --handoff-timeout"}
	roleModels = []RoleModel{Replicas, PrimarySecondary}
)

func (m RoleModel) String() string { return m.Name }

// ParseRoleModel returns the model named, the empty name read as Replicas, or an error naming
// the models there are: the one check of an assigner's --roles and a member's.
func ParseRoleModel(name string) (RoleModel, error) {
	if name == "" {
		return Replicas, nil
	}
	for _, m := range roleModels {
		if m.Name == name {
			return m, nil
		}
	}
	return RoleModel{}, fmt.Errorf("assignment: roles %q: want %s", name, RoleModelNames())
}

// RoleModels returns the role models there are, the default first.
func RoleModels() []RoleModel { return slices.Clone(roleModels) }

// RoleModelNames lists the models, for help and errors: "replicas or primary-secondary".
func RoleModelNames() string {
	names := make([]string, len(roleModels))
	for i, m := range roleModels {
		names[i] = m.Name
	}
	return strings.Join(names, " or ")
}

// Check refuses settings the model cannot work with: a primary hands its role over while
// its successor serves, so it needs make-before-break; only primaries take leases, so an
// exclusive cluster needs them.
func (m RoleModel) Check(breakBeforeMake, exclusive bool) error {
	switch {
	case m.Primaries && breakBeforeMake:
		return fmt.Errorf("assignment: roles %s move a primary make-before-break: it hands its role over while its successor serves; drop --make-before-break=false", m)
	case exclusive && !m.Primaries:
		return fmt.Errorf("assignment: an exclusive cluster gives leases on primary roles: it needs --roles %s", PrimarySecondary)
	}
	return nil
}

// Roles: in a cluster with primary and secondary replicas, each slice that has a serving
// replica has one Primary, which takes its writes; the other replicas are secondaries. The
// map holds at most one primary per slice at any time. A planned move of the primary role
// goes in two steps, so that no two replicas ever act as primary at once: Next names the
// replica to take over while Primary demotes itself (it stops taking writes and hands them
// over), and once it has, Next becomes Primary. The assigner decides both (see the
// assigner's roles.go); the map only keeps them consistent with the replica set.

// checkRoles validates a slice's roles: Primary a serving replica; Next only with a Primary,
// another serving replica.
func (s Slice) checkRoles() error {
	serving := func(id NodeID) bool { return s.Holds(id) && !s.IsLoading(id) }
	switch {
	case s.Primary != "" && !serving(s.Primary):
		return fmt.Errorf("%w: primary %s is not a serving replica", ErrBadRole, s.Primary)
	case s.Next == "":
		return nil
	case s.Primary == "":
		return fmt.Errorf("%w: next primary %s, but no primary to hand over from", ErrBadRole, s.Next)
	case s.Next == s.Primary || !serving(s.Next):
		return fmt.Errorf("%w: next primary %s is not another serving replica", ErrBadRole, s.Next)
	}
	return nil
}

// IsPrimary reports whether node id is the slice's primary and is not handing the role over:
// the replica that may take writes.
func (s Slice) IsPrimary(id NodeID) bool { return s.Primary == id && s.Next == "" }

// formatRoles writes a slice's roles as " primary=a next=b token=7", the empty parts left
// out.
func formatRoles(primary, next NodeID, token uint64) string {
	out := ""
	if primary != "" {
		out += " primary=" + string(primary)
	}
	if next != "" {
		out += " next=" + string(next)
	}
	if token != 0 {
		out += " token=" + strconv.FormatUint(token, 10)
	}
	return out
}

// checkToken refuses a token that would send a point's token back from before's, or one
// from a map not made yet (above the editor's generation plus one). That a new primary
// takes a higher token than its predecessor is the assigner's to ensure (it gives every
// grant the next generation's): within one Apply a slice's roles may pass through none.
func (e *editor) checkToken(before, after Slice) error {
	switch {
	case after.Token > e.generation+1:
		return fmt.Errorf("%w: token %d is beyond the map's generation %d", ErrBadRole, after.Token, e.generation)
	case after.Token < before.Token:
		return fmt.Errorf("%w: token %d would go back from %d", ErrBadRole, after.Token, before.Token)
	}
	return nil
}
