// Package slicectl holds the commands of the slicectl binary, one file per command.
package slicectl

import (
	"context"
	"errors"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// ErrUsage is wrapped by errors about how a command was called (bad flags or arguments), which
// main reports with exit status 2, as distinct from a command that ran and failed (status 1).
var ErrUsage = errors.New("usage")

// NewRootCommand returns the slicectl command tree. Output goes to out, diagnostics and
// progress to errOut.
func NewRootCommand(out, errOut io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "slicectl",
		Short: "Inspect, steer and simulate Sliceplane",
		Long: `slicectl is the command-line tool of Sliceplane, an auto-sharding control plane
that keeps the keys of a stateful service balanced across its storage nodes.

Today it runs the offline simulator, which compares balancing algorithms on the
same workload, and its data commands read and write the items of the built-in
etcd backend as a backend change tracker would; commands that talk to a running
assigner come later.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.SetErr(errOut)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	root.AddCommand(newSimCommand())
	root.AddCommand(newDataCommand())
	return root
}

// Execute runs the command tree with args and classifies cobra's own complaints about unknown
// commands as usage errors (cobra has no error type for them).
func Execute(ctx context.Context, args []string, out, errOut io.Writer) error {
	root := NewRootCommand(out, errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err != nil && !errors.Is(err, ErrUsage) && strings.HasPrefix(err.Error(), "unknown command") {
		return usageError(err)
	}
	return err
}

// noArgs is cobra.NoArgs, reporting extra arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.NoArgs(cmd, args); err != nil {
		return usageError(err)
	}
	return nil
}

type usage struct{ error }

func (u usage) Unwrap() []error { return []error{u.error, ErrUsage} }

func usageError(err error) error { return usage{err} }
