package slicectl

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// jsonTarget is a target as `targets -o json` lists it.
type jsonTarget struct {
	Name      string         `json:"name"`
	Leader    string         `json:"leader"`
	Config    map[string]any `json:"config"`
	ChangedBy string         `json:"changed_by,omitempty"`
	Action    string         `json:"action,omitempty"`
	ChangedAt *time.Time     `json:"changed_at,omitempty"`
}

type jsonTargets struct {
	Targets []jsonTarget `json:"targets"`
}

func targetJSON(t *pb.Target) jsonTarget {
	out := jsonTarget{Name: t.GetName(), Leader: t.GetLeader(), Config: map[string]any{}, ChangedBy: t.GetChangedBy(),
		Action: t.GetAction(), ChangedAt: jsonTime(t.GetChangedAt())}
	_ = yaml.Unmarshal([]byte(t.GetConfig()), &out.Config) // the assigner wrote it: it parses
	if out.Config == nil {
		out.Config = map[string]any{}
	}
	return out
}

func newTargetsCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "targets",
		Short: "List the targets (sharded services) of the control plane; create, update or delete one",
		Long: `targets lists the targets of the control plane: the sharded services it
serves, each with its own map, config, leader and access. A cluster started as
before targets has one, "default", configured by the assigner's flags; every
other target's config (target.yaml) says only how it differs from them.

Every command talks to a target with --target NAME (default: the default
target). Listing needs the viewer role, changing a target the admin role, both
with an identity that no target confines (docs/SECURITY.md).`,
		Example: `  slicectl targets
  slicectl targets -o json
  slicectl targets create kv -f kv.yaml
  slicectl targets update kv -f kv.yaml
  slicectl targets delete kv`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.targets.ListTargets(ctx, &pb.ListTargetsRequest{})
				if err != nil {
					return err
				}
				return printTargets(s, resp.GetTargets())
			})
		},
	}
	cmd.AddCommand(newTargetsCreateCommand(g), newTargetsUpdateCommand(g), newTargetsDeleteCommand(g))
	return cmd
}

func printTargets(s *session, ts []*pb.Target) error {
	if !s.out.table() {
		out := jsonTargets{Targets: []jsonTarget{}}
		for _, t := range ts {
			out.Targets = append(out.Targets, targetJSON(t))
		}
		return s.out.print(out)
	}
	w := newTable(s.out.w)
	row(w, "NAME", "LEADER", "LAST CHANGE")
	for _, t := range ts {
		leader, change := t.GetLeader(), "-"
		if leader == "" {
			leader = "none known"
		}
		if t.GetAction() != "" {
			change = fmt.Sprintf("%s by %s at %s", t.GetAction(), t.GetChangedBy(), t.GetChangedAt().AsTime().Format(time.RFC3339))
		}
		row(w, t.GetName(), leader, change)
	}
	return w.Flush()
}
