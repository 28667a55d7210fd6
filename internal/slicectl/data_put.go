package slicectl

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/source"
)

func newDataPutCommand(o *dataOptions) *cobra.Command {
	var frag, file string
	cmd := &cobra.Command{
		Use:   "put KEY [VALUE | -]",
		Short: "Set an item's value, or one of its fragments",
		Long: `put sets the value of item KEY, or with --fragment its fragment ID, and prints
the clock of the change. The value is VALUE, the contents of --file, or stdin
when VALUE is -. Setting the value keeps the item's fragments, and the other way
round.`,
		Example: `  slicectl data put user:1 alice
  slicectl data put user:1 hello --fragment msg/1
  slicectl data put user:1 --file alice.json
  echo -n alice | slicectl data put user:1 -
  slicectl data put --hex 00ff 68656c6c6f`,
		Args: positional("KEY", "VALUE")(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, id, isFrag, err := o.target(cmd, args[0], frag)
			if err != nil {
				return err
			}
			var value []byte
			switch {
			case cmd.Flags().Changed("file") && len(args) == 2:
				return usageError(fmt.Errorf("VALUE %q and --file %q: give one or the other", args[1], file))
			case cmd.Flags().Changed("file"):
				if value, err = os.ReadFile(file); err != nil {
					return fmt.Errorf("reading the value: %w", err)
				}
			case len(args) < 2:
				return usageError(fmt.Errorf("missing VALUE: give it as an argument, - for stdin, or --file (usage: %s)", cmd.UseLine()))
			case args[1] == "-":
				if value, err = io.ReadAll(cmd.InOrStdin()); err != nil {
					return fmt.Errorf("reading the value from stdin: %w", err)
				}
			default:
				if value, err = o.decode("VALUE", args[1]); err != nil {
					return usageError(err)
				}
			}
			return o.withSource(cmd, func(ctx context.Context, s *source.Etcd) error {
				var clock uint64
				if isFrag {
					clock, err = s.PutFragment(ctx, key, id, value)
				} else {
					clock, err = s.Put(ctx, key, value)
				}
				if err != nil {
					return err
				}
				line := fmt.Sprintf("put %s at clock %d", o.showBytes(key), clock)
				if isFrag {
					line = fmt.Sprintf("put %s fragment %q at clock %d", o.showBytes(key), id, clock)
				}
				return o.emit(cmd.OutOrStdout(), changeJSON("put", key, id, isFrag, clock), line)
			})
		},
	}
	cmd.Flags().StringVar(&frag, "fragment", "", "set this fragment of the item instead of its value")
	cmd.Flags().StringVar(&file, "file", "", "read the value from this file")
	return cmd
}
