package slicectl

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

func newTargetsCreateCommand(g *globalOptions) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "create NAME [-f target.yaml]",
		Short: "Create a target, with its config",
		Long: `create registers a new target. Its config (-f, a target.yaml; - reads standard
input; none: the assigner's flags as they are) says how it differs from the
assigner's flags: algorithm and params, roles and exclusive, node_ttl,
min_replicas and max_replicas, zone_label, churn_budget, and
imbalance_tolerance (tight, default or loose). The assigner checks it and names
the field it refuses; the change is audited. The target is led by one of the
live assigners within a second; its members, routers and distributors name it
(docs/OPERATIONS.md).`,
		Example: `  slicectl targets create kv -f kv.yaml
  printf 'min_replicas: 2\nimbalance_tolerance: tight\n' | slicectl targets create sessions -f -`,
		Args: positional("NAME")(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return putTarget(cmd, g, args[0], file, true)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the target's config, a target.yaml (- for standard input)")
	return cmd
}

// putTarget creates (create) or updates target name with the config in file, and prints it.
func putTarget(cmd *cobra.Command, g *globalOptions, name, file string, create bool) error {
	config, err := readTargetConfig(cmd, file)
	if err != nil {
		return usageError(err)
	}
	return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
		var t *pb.Target
		if create {
			resp, err := s.targets.CreateTarget(ctx, &pb.CreateTargetRequest{Name: name, Config: config})
			if err != nil {
				return err
			}
			t = resp.GetTarget()
		} else {
			resp, err := s.targets.UpdateTarget(ctx, &pb.UpdateTargetRequest{Name: name, Config: config})
			if err != nil {
				return err
			}
			t = resp.GetTarget()
		}
		return printTargets(s, []*pb.Target{t})
	})
}

// readTargetConfig reads the -f file: "" for none, - for standard input.
func readTargetConfig(cmd *cobra.Command, file string) (string, error) {
	var data []byte
	var err error
	switch file {
	case "":
		return "", nil
	case "-":
		data, err = io.ReadAll(cmd.InOrStdin())
	default:
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return "", fmt.Errorf("-f %s: %w", file, err)
	}
	return string(data), nil
}
