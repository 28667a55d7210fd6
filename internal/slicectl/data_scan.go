package slicectl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

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
	_, err = s.Scan(ctx, r, at, func(it source.Item) error {
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
