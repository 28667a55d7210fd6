package slicectl

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

func newTargetsDeleteCommand(g *globalOptions) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "delete NAME [--force]",
		Short: "Delete a target and its map",
		Long: `delete removes a target: its config, its map, its members' records and its
history. It is refused while members are registered (drain them and stop them
first), unless --force. The items of an etcd source stay under the target's
data/ prefix. The default target cannot be deleted. The change is audited.`,
		Example: `  slicectl targets delete kv
  slicectl targets delete kv --force`,
		Args: positional("NAME")(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				if _, err := s.targets.DeleteTarget(ctx, &pb.DeleteTargetRequest{Name: args[0], Force: force}); err != nil {
					return err
				}
				if s.out.table() {
					_, err := fmt.Fprintf(s.out.w, "deleted target %s\n", args[0])
					return err
				}
				return s.out.print(map[string]string{"deleted": args[0]})
			})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "delete even while members are registered")
	return cmd
}
