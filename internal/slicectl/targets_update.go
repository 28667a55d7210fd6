package slicectl

import (
	"github.com/spf13/cobra"
)

func newTargetsUpdateCommand(g *globalOptions) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "update NAME -f target.yaml",
		Short: "Replace a target's config",
		Long: `update replaces the config of a target with the one in -f (a target.yaml; - reads
standard input), checked as create checks it. The target's leader applies it in
a new term of that target, within about a second; no assigner restarts and no
other target notices. The change is audited.`,
		Example: `  slicectl targets update kv -f kv.yaml`,
		Args:    positional("NAME")(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return putTarget(cmd, g, args[0], file, false)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the target's config, a target.yaml (- for standard input)")
	_ = cmd.MarkFlagRequired("file")
	return cmd
}
