package slicectl

import (
	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/client/writer"
)

func newDataCommand(g *globalOptions) *cobra.Command {
	o := &dataOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "data",
		Short: "Read and write the data items of the built-in etcd backend",
		Long: `data reads and writes data items in the built-in backend, an etcd key prefix,
as a backend change tracker would: every write is a change with a clock (the etcd
revision) that the assigner and distributors pick up and deliver to the nodes
holding the item's slice.

An item has a key, an optional value of its own and optional fragments, each
with an ID; it is placed by the xxhash64 of its key. --prefix must be the data
prefix the assigner reads: its --prefix plus "data/", by default ` + writer.DefaultPrefix + `;
with --target T and no --prefix, target T's: /sliceplane/t/T/data/.

KEY and VALUE are taken as text, or as hex with --hex (for binary keys); the
table output then shows keys and values in hex too. Values read from a file or
stdin are taken byte for byte. The JSON output is one object per line, the YAML
output one document per item or change.`,
		Example: `  # Write an item and one of its fragments, read it back, list a slice.
  slicectl data put user:1 alice
  slicectl data put user:1 hello --fragment msg/1
  slicectl data get user:1
  slicectl data scan --slice 0x0-0x4000000000000000 --limit 20

  # Against another cluster and prefix, as JSON.
  slicectl data scan --etcd-endpoints 10.0.0.1:2379,10.0.0.2:2379 --prefix /prod/data/ -o json`,
		Args: cobra.ArbitraryArgs,
		RunE: helpOrUnknown,
	}
	f := cmd.PersistentFlags()
	f.StringSliceVar(&o.endpoints, "etcd-endpoints", []string{"127.0.0.1:2379"}, "etcd cluster endpoints, comma-separated")
	f.StringVar(&o.prefix, "prefix", writer.DefaultPrefix, "etcd key prefix of the data items; must match the assigner's data prefix")
	f.BoolVar(&o.hex, "hex", false, "KEY and VALUE arguments are hex (for binary keys); the table output shows hex")
	cmd.AddCommand(newDataPutCommand(o), newDataGetCommand(o), newDataDeleteCommand(o), newDataScanCommand(o))
	return cmd
}
