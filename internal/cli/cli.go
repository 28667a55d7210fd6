// Package cli holds what Sliceplane's commands share at their edge: the usage error and the
// one mapping from a command's error to its exit status.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// ErrUsage is wrapped by errors about how a command was called (bad flags, arguments or
// config file), as distinct from a command that ran and failed.
var ErrUsage = errors.New("usage")

// Exit statuses.
const (
	ExitOK          = 0
	ExitFailed      = 1
	ExitUsage       = 2
	ExitInterrupted = 130 // as a shell reports a command killed by SIGINT
)

// ExitCode maps a command's error to its exit status: 0 for none, 2 for a usage error, 130
// for one that ends because it was interrupted, 1 for any other.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrUsage):
		return ExitUsage
	case errors.Is(err, context.Canceled):
		return ExitInterrupted
	}
	return ExitFailed
}

// Main runs a command's body with a context that SIGINT and SIGTERM cancel, reports its error
// on stderr prefixed by name, and exits with ExitCode.
func Main(name string, run func(ctx context.Context) error) {
	os.Exit(run1(name, run, os.Stderr))
}

func run1(name string, run func(ctx context.Context) error, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
	}
	return ExitCode(err)
}
