package authz

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/target"
)

// Role is what an identity may do.
type Role string

// The roles. An identity has the role its kind names (spiffe://sliceplane/admin/alice is an
// admin), the roles the policy grants it, and the roles those imply: admin implies viewer,
// viewer implies router; node and distributor imply router (they read the map).
const (
	// RoleNode may Register, Heartbeat, ReportLoad, Deregister and Pull, only as itself.
	RoleNode Role = "node"
	// RoleDistributor may watch the quanta.
	RoleDistributor Role = "distributor"
	// RoleRouter may read the map and where the nodes serve: WatchAssignment,
	// GetAssignment, Lookup, ListNodes.
	RoleRouter Role = "router"
	// RoleViewer may inspect: Status, ListSlices, ListQuanta, Explain, and the web view.
	RoleViewer Role = "viewer"
	// RoleAdmin may change: Move, Split, Merge, Pin, Unpin, Unquarantine, Drain, Freeze, Unfreeze,
	// SetAlgorithm.
	RoleAdmin Role = "admin"
	// RoleAssigner is the assigners' own identity; no method needs it.
	RoleAssigner Role = "assigner"
)

var known = []Role{RoleNode, RoleDistributor, RoleRouter, RoleViewer, RoleAdmin, RoleAssigner}

var implies = map[Role][]Role{
	RoleAdmin:       {RoleViewer},
	RoleViewer:      {RoleRouter},
	RoleNode:        {RoleRouter},
	RoleDistributor: {RoleRouter},
}

// ErrPolicy marks a policy file that cannot be used.
var ErrPolicy = errors.New("authz: bad policy")

// Policy grants identities roles beyond their kind's, and scopes identities that name no
// target to some targets. The YAML file (--authz-policy):
//
//	grants:
//	  spiffe://sliceplane/node/n1: [viewer]       # one identity
//	  spiffe://sliceplane/router/*: [viewer]      # every identity of a kind
//	  spiffe://sliceplane/target/kv/node/*: [viewer]  # every one of a kind in target kv
//	scopes:
//	  spiffe://sliceplane/admin/alice: [kv, counter]  # alice acts in these targets only
//	  spiffe://sliceplane/viewer/*: [default]
//
// A nil Policy grants nothing beyond the kinds and scopes no one.
type Policy struct {
	grants map[string][]Role
	scopes map[string][]string
}

type policyFile struct {
	Grants map[string][]Role   `yaml:"grants"`
	Scopes map[string][]string `yaml:"scopes"`
}

// ParsePolicy reads a policy; unknown fields, roles and malformed identities are errors.
func ParsePolicy(data []byte) (*Policy, error) {
	var f policyFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	for id, roles := range f.Grants {
		if _, err := mtls.ParseID(id); err != nil {
			return nil, fmt.Errorf("%w: %q is not spiffe://%s/<kind>/<name> (or <kind>/*), nor spiffe://%s/target/<target>/<kind>/<name>",
				ErrPolicy, id, mtls.TrustDomain, mtls.TrustDomain)
		}
		for _, r := range roles {
			if !slices.Contains(known, r) {
				return nil, fmt.Errorf("%w: %q: unknown role %q (roles: %s)", ErrPolicy, id, r, joinRoles(known))
			}
		}
	}
	if err := checkScopes(f.Scopes); err != nil {
		return nil, err
	}
	return &Policy{grants: f.Grants, scopes: f.Scopes}, nil
}

// checkScopes refuses a scope of an identity that is no identity or is confined to a target
// already (its certificate says where it acts), and one that names no target or a bad name.
func checkScopes(scopes map[string][]string) error {
	for id, targets := range scopes {
		parsed, err := mtls.ParseID(id)
		switch {
		case err != nil:
			return fmt.Errorf("%w: scopes: %q is not spiffe://%s/<kind>/<name> (or <kind>/*)", ErrPolicy, id, mtls.TrustDomain)
		case parsed.Target != "":
			return fmt.Errorf("%w: scopes: %q is confined to target %q by its certificate already", ErrPolicy, id, parsed.Target)
		case len(targets) == 0:
			return fmt.Errorf("%w: scopes: %q: want at least one target", ErrPolicy, id)
		}
		for _, t := range targets {
			if err := target.CheckRef(t); err != nil {
				return fmt.Errorf("%w: scopes: %q: %w", ErrPolicy, id, err)
			}
		}
	}
	return nil
}

// LoadPolicy reads the policy file at path; an empty path means no policy.
func LoadPolicy(path string) (*Policy, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Roles returns every role id has.
func (p *Policy) Roles(id mtls.Identity) RoleSet {
	set := RoleSet{}
	set.add(Role(id.Kind))
	if p != nil {
		for _, r := range p.grants[id.ID] {
			set.add(r)
		}
		for _, r := range p.grants[kindPattern(id)] {
			set.add(r)
		}
	}
	return set
}

// kindPattern is the policy's entry for every identity of id's kind (in its target, if
// confined): spiffe://sliceplane/<kind>/* for spiffe://sliceplane/<kind>/<name>.
func kindPattern(id mtls.Identity) string { return id.ID[:strings.LastIndex(id.ID, "/")+1] + "*" }

// Scope returns the targets the policy lets id act in, nil for no scope: its own entry, or
// else its kind's (<kind>/*).
func (p *Policy) Scope(id mtls.Identity) []string {
	if p == nil {
		return nil
	}
	if s, ok := p.scopes[id.ID]; ok {
		return s
	}
	return p.scopes[kindPattern(id)]
}

// Admits reports whether id may act in target in, by its certificate and the policy's
// scopes, whatever its roles: what a list of the targets shows it.
func (p *Policy) Admits(id mtls.Identity, in string) bool {
	return confined(id, p.Scope(id), Rule{}, target.Name(in)) == ""
}

// RoleSet is a set of roles, closed under implication.
type RoleSet map[Role]bool

func (s RoleSet) add(r Role) {
	if !slices.Contains(known, r) || s[r] {
		return
	}
	s[r] = true
	for _, i := range implies[r] {
		s.add(i)
	}
}

func (s RoleSet) has(r Role) bool { return s[r] }

// anyOf reports whether s holds one of roles other than except.
func (s RoleSet) anyOf(roles []Role, except Role) bool {
	for _, r := range roles {
		if r != except && s[r] {
			return true
		}
	}
	return false
}

// String lists the roles in order, "none" for none.
func (s RoleSet) String() string {
	var rs []Role
	for r := range s {
		rs = append(rs, r)
	}
	if len(rs) == 0 {
		return "none"
	}
	return joinRoles(rs)
}

func joinRoles(rs []Role) string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func contains(rs []Role, r Role) bool { return slices.Contains(rs, r) }

// LoadServer loads what a server is secured with: its TLS files (nil for none) and its policy
// file (nil for none). A policy without TLS is refused: without TLS no caller has an identity
// to grant roles to, and every call is let through.
func LoadServer(tls mtls.Config, policyPath string) (*mtls.Source, *Policy, error) {
	src, err := tls.Load()
	if err != nil {
		return nil, nil, err
	}
	if policyPath != "" && src == nil {
		return nil, nil, fmt.Errorf("%w: --authz-policy needs --tls-cert, --tls-key and --tls-ca: without TLS no caller is known, and every call is let through", ErrPolicy)
	}
	policy, err := LoadPolicy(policyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("--authz-policy: %w", err)
	}
	return src, policy, nil
}
