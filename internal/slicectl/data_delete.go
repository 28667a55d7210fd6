package slicectl

import (
	"context"
	"fmt"
	"slices"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/source"
)

func newDataDeleteCommand(o *dataOptions) *cobra.Command {
	var frag string
	cmd := &cobra.Command{
		Use:   "delete KEY",
		Short: "Delete an item with all its fragments, or one fragment",
		Long: `delete removes item KEY, its value and all its fragments, in one change; with
--fragment it removes that fragment alone. It prints the clock of the change, and
fails if there is nothing to delete.`,
		Example: `  slicectl data delete user:1
  slicectl data delete user:1 --fragment msg/1`,
		Args: positional("KEY")(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, id, isFrag, err := o.target(cmd, args[0], frag)
			if err != nil {
				return err
			}
			return o.withSource(cmd, func(ctx context.Context, s *source.Etcd) error {
				// A delete of nothing still succeeds in etcd; look first, so that a typo in
				// the key or the prefix is reported rather than printed as done.
				it, ok, err := s.Get(ctx, key)
				switch {
				case err != nil:
					return err
				case !ok:
					return fmt.Errorf("item %s not found under prefix %q", o.showBytes(key), o.prefix)
				case isFrag && !slices.ContainsFunc(it.Fragments, func(f source.Fragment) bool { return f.ID == id }):
					return fmt.Errorf("item %s has no fragment %q", o.showBytes(key), id)
				}
				var clock uint64
				line := ""
				if isFrag {
					clock, err = s.DeleteFragment(ctx, key, id)
					line = fmt.Sprintf("deleted %s fragment %q at clock %d", o.showBytes(key), id, clock)
				} else {
					clock, err = s.Delete(ctx, key)
					line = fmt.Sprintf("deleted %s at clock %d", o.showBytes(key), clock)
				}
				if err != nil {
					return err
				}
				return o.emit(cmd.OutOrStdout(), changeJSON("delete", key, id, isFrag, clock), line)
			})
		},
	}
	cmd.Flags().StringVar(&frag, "fragment", "", "delete only this fragment of the item")
	return cmd
}
