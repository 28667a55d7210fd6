package slicectl

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/target"
)

// dataOptions are the flags shared by the data commands; --output and --timeout are the
// global ones.
type dataOptions struct {
	*globalOptions
	endpoints []string
	prefix    string
	hex       bool
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

// target reads what put and delete act on: the options, the item's KEY and --fragment. Every
// error is a usage error.
func (o *dataOptions) target(cmd *cobra.Command, arg, frag string) (key []byte, id string, isFrag bool, err error) {
	if err := o.check(); err != nil {
		return nil, "", false, usageError(err)
	}
	if key, err = o.key(arg); err != nil {
		return nil, "", false, usageError(err)
	}
	if id, isFrag, err = fragment(cmd, frag); err != nil {
		return nil, "", false, usageError(err)
	}
	return key, id, isFrag, nil
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

// dataPrefix is --prefix, or with --target and no --prefix the target's data prefix in the
// default layout (/sliceplane/t/<target>/data/).
func (o *dataOptions) dataPrefix(cmd *cobra.Command) string {
	if o.globalOptions.target == "" || cmd.Flags().Changed("prefix") {
		return o.prefix
	}
	return target.DataPrefix(strings.TrimSuffix(writer.DefaultPrefix, "data/"), o.globalOptions.target)
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
	err = fn(ctx, source.NewEtcd(cli, o.dataPrefix(cmd)))
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
