package slicectl

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

func newDataGetCommand(o *dataOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "get KEY",
		Short: "Print an item: its value and fragments",
		Long: `get prints item KEY as of now: its hash, its value and its fragments. It fails
if the item has neither a value nor fragments.`,
		Example: `  slicectl data get user:1
  slicectl data get user:1 -o json
  slicectl data get --hex 00ff`,
		Args: positional("KEY")(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return usageError(err)
			}
			key, err := o.key(args[0])
			if err != nil {
				return usageError(err)
			}
			return o.withSource(cmd, func(ctx context.Context, s *source.Etcd) error {
				it, ok, err := s.Get(ctx, key)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("item %s not found under prefix %q", o.showBytes(key), o.prefix)
				}
				return o.printItem(cmd.OutOrStdout(), it)
			})
		},
	}
}

func (o *dataOptions) printItem(w io.Writer, it source.Item) error {
	if o.output != "table" {
		return newPrinter(w, o.output).line(itemJSON(it))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "key        %s\n", o.showBytes(it.Key))
	fmt.Fprintf(&b, "hash       %s\n", keyspace.FormatPoint(it.Hash))
	if it.Exists {
		fmt.Fprintf(&b, "value      %s (%d bytes)\n", o.showBytes(it.Value), len(it.Value))
	} else {
		fmt.Fprintf(&b, "value      none (fragments only)\n")
	}
	fmt.Fprintf(&b, "fragments  %d\n", len(it.Fragments))
	for _, f := range it.Fragments {
		fmt.Fprintf(&b, "  %q  %s (%d bytes)\n", f.ID, o.showBytes(f.Value), len(f.Value))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
