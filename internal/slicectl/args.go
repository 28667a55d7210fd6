package slicectl

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// positional checks the arguments' count, naming what is missing or extra: cobra's own
// messages ("accepts 1 arg(s), received 0") do not say which.
func positional(names ...string) func(minArgs int) cobra.PositionalArgs {
	return func(minArgs int) cobra.PositionalArgs {
		return func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) < minArgs:
				return usageError(fmt.Errorf("missing %s (usage: %s)", strings.Join(names[len(args):minArgs], " and "), cmd.UseLine()))
			case len(args) > len(names):
				return usageError(fmt.Errorf("unexpected argument %q (usage: %s)", args[len(names)], cmd.UseLine()))
			}
			return nil
		}
	}
}
