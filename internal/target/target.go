// Package target holds what makes one control plane serve many sharded services: a target
// is one service, with its own map, quanta, passes, config, leader and access. This package
// names targets, lays out their keys in etcd, parses their config, ranks the assigners that
// may lead each one (Rank), and keeps the registry of targets in etcd (Registry).
//
// A cluster started as before has one target, Default, whose keys are where they always
// were: directly under the cluster's prefix. Every other target's keys are under
// <prefix>t/<name>/, laid out inside as the default target's are under <prefix>.
package target

import (
	"errors"
	"fmt"
	"regexp"
)

// Default is the target of every client, flag and script that names none; its config is
// the assigner's flags.
const Default = "default"

// MetadataKey is the gRPC metadata key in which a call names its target; a call without it
// is the default target's.
const MetadataKey = "x-sliceplane-target"

// ErrInvalid marks a name or a config that cannot be used; the message names the field.
var ErrInvalid = errors.New("target: invalid")

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CheckName accepts a DNS label: 1-63 lower-case letters, digits and hyphens, neither first
// nor last a hyphen. A name is part of etcd keys, metric labels, SPIFFE IDs and gRPC health
// service names, which all take such a label as it is.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: name %q: want 1-63 lower-case letters, digits and hyphens, not starting or ending with a hyphen", ErrInvalid, name)
	}
	return nil
}

// CheckRef accepts what names a target in a client's config or a flag: a name CheckName
// accepts, or "" for the default target.
func CheckRef(name string) error {
	if name == "" {
		return nil
	}
	return CheckName(name)
}

// Name returns name, or Default for "".
func Name(name string) string {
	if name == "" {
		return Default
	}
	return name
}

// Root returns where target name keeps its keys under the cluster's prefix: the prefix
// itself for the default target, so that a cluster from before targets is its default one.
func Root(prefix, name string) string {
	if Name(name) == Default {
		return prefix
	}
	return prefix + "t/" + name + "/"
}

// DataPrefix returns where the built-in etcd source of target name keeps its items: its
// root plus "data/".
func DataPrefix(prefix, name string) string { return Root(prefix, name) + "data/" }

// DefaultLeaderHealth is the default target's leader health service, as before targets.
const DefaultLeaderHealth = "sliceplane.leader"

// LeaderHealthService returns the gRPC health service name that an assigner serves while it
// leads target name: "sliceplane.leader" for the default target, as before targets, and
// "sliceplane.leader/<name>" for the others.
func LeaderHealthService(name string) string {
	if Name(name) == Default {
		return DefaultLeaderHealth
	}
	return "sliceplane.leader/" + name
}
