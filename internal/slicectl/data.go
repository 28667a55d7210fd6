package slicectl

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// dataOptions are the flags shared by the data commands; --output and --timeout are the
// global ones.
type dataOptions struct {
	*globalOptions
	endpoints []string
	prefix    string
	hex       bool
}

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
prefix the assigner reads: its --prefix plus "data/", by default ` + writer.DefaultPrefix + `.

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

// check validates the shared flags, before anything reaches etcd.
func (o *dataOptions) check() error {
	if err := o.globalOptions.check(outputs); err != nil {
		return err
	}
	switch {
	case o.prefix == "":
		return errors.New("--prefix is empty: the items would mix with every other key of the cluster")
	case len(o.endpoints) == 0:
		return errors.New("--etcd-endpoints is empty: give at least one endpoint")
	}
	for _, e := range o.endpoints {
		if strings.TrimSpace(e) == "" {
			return fmt.Errorf("--etcd-endpoints %q: an endpoint is empty", strings.Join(o.endpoints, ","))
		}
	}
	return nil
}

// decode reads a KEY or VALUE argument, as text or, with --hex, as hex.
func (o *dataOptions) decode(what, arg string) ([]byte, error) {
	if !o.hex {
		return []byte(arg), nil
	}
	s := arg
	if len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		s = s[2:]
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%s %q is not hex (--hex): %w", what, arg, err)
	}
	return b, nil
}

func (o *dataOptions) key(arg string) ([]byte, error) {
	key, err := o.decode("KEY", arg)
	if err == nil && len(key) == 0 {
		err = errors.New("KEY is empty: an item needs a key to be placed by")
	}
	return key, err
}

// fragment returns the --fragment flag, and whether it was given at all: an empty ID must be
// refused, not taken for the item itself.
func fragment(cmd *cobra.Command, id string) (string, bool, error) {
	if !cmd.Flags().Changed("fragment") {
		return "", false, nil
	}
	if id == "" {
		return "", true, errors.New("--fragment is empty: a fragment needs an ID")
	}
	return id, true, nil
}

// showBytes formats a key or value for the table output.
func (o *dataOptions) showBytes(b []byte) string {
	if o.hex {
		return hex.EncodeToString(b)
	}
	return strconv.Quote(string(b))
}

// withSource runs fn against the source, within --timeout.
func (o *dataOptions) withSource(cmd *cobra.Command, fn func(ctx context.Context, s *source.Etcd) error) error {
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, o.timeout)
	defer cancel()
	endpoints := strings.Join(o.endpoints, ",")
	src, err := o.loadTLS()
	if err != nil {
		return err
	}
	// The client dials lazily: an unreachable cluster shows up as the first request running
	// into ctx's deadline, which the error below then explains.
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: o.endpoints, DialTimeout: o.timeout, Context: ctx, Logger: zap.NewNop(),
		TLS: src.ClientTLS(),
	})
	if err != nil {
		return fmt.Errorf("connecting to etcd at %s: %w", endpoints, err)
	}
	defer cli.Close()
	err = fn(ctx, source.NewEtcd(cli, o.prefix))
	switch {
	case err == nil:
		return nil
	case parent.Err() != nil: // interrupted: let main see context.Canceled
		return fmt.Errorf("%w: %w", err, parent.Err())
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		if src == nil && etcdWantsTLS(o.endpoints) {
			return fmt.Errorf("%w (etcd at %s requires TLS: give %s)", err, endpoints, tlsFlagsHelp)
		}
		return fmt.Errorf("%w (etcd at %s gave no answer within --timeout %s)", err, endpoints, o.timeout)
	}
	return err
}

// emit writes one result: its JSON or YAML form with -o json or yaml, else the text line.
func (o *dataOptions) emit(w io.Writer, v any, line string) error {
	if o.output != "table" {
		return newPrinter(w, o.output).line(v)
	}
	_, err := fmt.Fprintln(w, line)
	return err
}

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

// jsonBytes holds a key or value in JSON: as a string when it is valid UTF-8, which JSON can
// carry unchanged, else as base64 in the field named with _base64.
type jsonBytes struct {
	text, b64 *string
}

func toJSON(b []byte) jsonBytes {
	if utf8.Valid(b) {
		s := string(b)
		return jsonBytes{text: &s}
	}
	s := base64.StdEncoding.EncodeToString(b)
	return jsonBytes{b64: &s}
}

type jsonChange struct {
	Op        string  `json:"op"`
	Key       *string `json:"key,omitempty"`
	KeyBase64 *string `json:"key_base64,omitempty"`
	Hash      string  `json:"hash"`
	Fragment  *string `json:"fragment,omitempty"`
	Clock     uint64  `json:"clock"`
}

type jsonFragment struct {
	ID          string  `json:"id"`
	Value       *string `json:"value,omitempty"`
	ValueBase64 *string `json:"value_base64,omitempty"`
}

type jsonItem struct {
	Key       *string `json:"key,omitempty"`
	KeyBase64 *string `json:"key_base64,omitempty"`
	Hash      string  `json:"hash"`
	// Value and ValueBase64 are both absent when the item has fragments alone.
	Value       *string        `json:"value,omitempty"`
	ValueBase64 *string        `json:"value_base64,omitempty"`
	Fragments   []jsonFragment `json:"fragments"`
}

func changeJSON(op string, key []byte, frag string, hasFrag bool, clock uint64) jsonChange {
	k := toJSON(key)
	c := jsonChange{Op: op, Key: k.text, KeyBase64: k.b64, Hash: keyspace.FormatPoint(keyspace.Hash(key)), Clock: clock}
	if hasFrag {
		c.Fragment = &frag
	}
	return c
}

func itemJSON(it source.Item) jsonItem {
	k := toJSON(it.Key)
	out := jsonItem{KeyBase64: k.b64, Key: k.text, Hash: keyspace.FormatPoint(it.Hash), Fragments: []jsonFragment{}}
	if it.Exists {
		v := toJSON(it.Value)
		out.Value, out.ValueBase64 = v.text, v.b64
	}
	for _, f := range it.Fragments {
		v := toJSON(f.Value)
		out.Fragments = append(out.Fragments, jsonFragment{ID: f.ID, Value: v.text, ValueBase64: v.b64})
	}
	return out
}

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
			if err := o.check(); err != nil {
				return usageError(err)
			}
			key, err := o.key(args[0])
			if err != nil {
				return usageError(err)
			}
			id, isFrag, err := fragment(cmd, frag)
			if err != nil {
				return usageError(err)
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
			if err := o.check(); err != nil {
				return usageError(err)
			}
			key, err := o.key(args[0])
			if err != nil {
				return usageError(err)
			}
			id, isFrag, err := fragment(cmd, frag)
			if err != nil {
				return usageError(err)
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

type scanOptions struct {
	start, end, slice string
	limit             int
	at                uint64
}

func newDataScanCommand(o *dataOptions) *cobra.Command {
	so := &scanOptions{}
	cmd := &cobra.Command{
		Use:   "scan",
		Short: "List the items in a range of the hash space as of a clock",
		Long: `scan lists, in hash order, the items whose hash lies in [--start, --end) or in
the slice START-END, as of clock --at: by default the whole space as of now.
Points are 0x-prefixed hex (as printed) or decimal; an end may be "end", the end
of the space. The table shows each item's hash, the size of its value ("-" when
it has fragments only), its number of fragments and its key; -o json prints one
object per item with its values.`,
		Example: `  slicectl data scan
  slicectl data scan --start 0x4000000000000000 --end 0x8000000000000000
  slicectl data scan --slice 0xc000000000000000-end --limit 10
  slicectl data scan --at 42 -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return usageError(err)
			}
			r, err := so.hashRange(cmd)
			if err != nil {
				return usageError(err)
			}
			if so.limit < 0 {
				return usageError(fmt.Errorf("--limit %d: want 0 (no limit) or more", so.limit))
			}
			return o.withSource(cmd, func(ctx context.Context, s *source.Etcd) error {
				return o.scan(ctx, cmd, s, r, so)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&so.start, "start", "", "first hash of the range (default 0)")
	f.StringVar(&so.end, "end", "", `hash the range ends before, or "end" (default end)`)
	f.StringVar(&so.slice, "slice", "", "the range as START-END, instead of --start and --end")
	f.IntVar(&so.limit, "limit", 0, "list at most this many items; 0 lists all")
	f.Uint64Var(&so.at, "at", 0, "clock to read at; 0 is now")
	return cmd
}

// hashRange parses --start, --end and --slice.
func (so *scanOptions) hashRange(cmd *cobra.Command) (keyspace.Range, error) {
	r := keyspace.Full()
	start, end := so.start, so.end
	var given []string // the flags as given, to say which ones are wrong
	for _, name := range []string{"start", "end"} {
		if cmd.Flags().Changed(name) {
			given = append(given, "--"+name+" "+cmd.Flags().Lookup(name).Value.String())
		}
	}
	flags := strings.Join(given, " ")
	if cmd.Flags().Changed("slice") {
		if cmd.Flags().Changed("start") || cmd.Flags().Changed("end") {
			return r, errors.New("--slice and --start/--end: give one or the other")
		}
		var ok bool
		if start, end, ok = strings.Cut(so.slice, "-"); !ok {
			return r, fmt.Errorf("--slice %q: want START-END, such as 0x0-0x4000000000000000 or 0x8000000000000000-end", so.slice)
		}
		flags = fmt.Sprintf("--slice %s", so.slice)
	}
	var err error
	if start != "" || cmd.Flags().Changed("start") {
		if r.Start, err = keyspace.ParsePoint(start); err != nil {
			return r, fmt.Errorf("%s: start: %w", flags, err)
		}
	}
	if end != "" || cmd.Flags().Changed("end") {
		if r.End, err = keyspace.ParseBound(end); err != nil {
			return r, fmt.Errorf("%s: end: %w", flags, err)
		}
	}
	if !r.Valid() {
		return r, fmt.Errorf("%s: the range [%s, %s) is empty: the start must be below the end",
			flags, keyspace.FormatPoint(r.Start), r.End)
	}
	return r, nil
}

// errLimit stops a scan once it has seen one item more than --limit, which tells that the
// listing is cut short.
var errLimit = errors.New("limit reached")

func (o *dataOptions) scan(ctx context.Context, cmd *cobra.Command, s *source.Etcd, r keyspace.Range, so *scanOptions) error {
	now, err := s.Clock(ctx)
	if err != nil {
		return err
	}
	at := so.at
	switch {
	case at == 0:
		// Scan reads in pages at the clock it is given; 0 would let each page read the
		// latest data, and the listing would not be one snapshot.
		at = now
	case at > now:
		return usageError(fmt.Errorf("--at %d: the current clock is %d", at, now))
	}
	w := cmd.OutOrStdout()
	p := newPrinter(w, o.output)
	if o.output == "table" {
		// Fixed widths and the key last, so that a long listing streams instead of waiting
		// for the widest key.
		fmt.Fprintf(w, "%-18s  %10s  %9s  %s\n", "HASH", "VALUE", "FRAGMENTS", "KEY")
	}
	n := 0
	err = s.Scan(ctx, r, at, func(it source.Item) error {
		if so.limit > 0 && n == so.limit {
			return errLimit
		}
		n++
		if o.output != "table" {
			return p.line(itemJSON(it))
		}
		size := "-"
		if it.Exists {
			size = strconv.Itoa(len(it.Value))
		}
		_, err := fmt.Fprintf(w, "%-18s  %10s  %9d  %s\n", keyspace.FormatPoint(it.Hash), size, len(it.Fragments), o.showBytes(it.Key))
		return err
	})
	more := errors.Is(err, errLimit)
	if err != nil && !more {
		return err
	}
	summary := fmt.Sprintf("%d items in %s at clock %d", n, r, at)
	if more {
		summary += fmt.Sprintf("; more follow (--limit %d)", so.limit)
	}
	if o.output == "table" {
		_, err = fmt.Fprintln(w, summary)
		return err
	}
	_, err = fmt.Fprintln(cmd.ErrOrStderr(), summary)
	return err
}
