// Command slicectl inspects, steers and simulates Sliceplane. See slicectl --help.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sliceplane/sliceplane/internal/slicectl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := slicectl.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "slicectl:", err)
	switch {
	case errors.Is(err, slicectl.ErrUsage):
		os.Exit(2)
	case errors.Is(err, context.Canceled):
		os.Exit(130)
	}
	os.Exit(1)
}
