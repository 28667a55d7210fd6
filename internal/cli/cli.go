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
// on stderr prefixed by name, and exits with ExitCode. The first signal cancels the context
// (a member drains, a node hands its slices over); the next ends the process as the signal's
// default does, for an operator who will not wait.
func Main(name string, run func(ctx context.Context) error) {
	os.Exit(run1(name, run, os.Stderr))
}

// Exit reports a command's error on stderr prefixed by name, and exits with ExitCode: for a
// command that handles signals itself.
func Exit(name string, err error) {
	os.Exit(report(name, err, os.Stderr))
}

func run1(name string, run func(ctx context.Context) error, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			stop() // the next signal takes its default course
		case <-done:
		}
	}()
	return report(name, run(ctx), stderr)
}

func report(name string, err error, stderr io.Writer) int {
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
	}
	return ExitCode(err)
}
