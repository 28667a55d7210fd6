// Command distributor runs a Sliceplane distributor. See distributor --help.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sliceplane/sliceplane/internal/distributormain"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := distributormain.NewCommand().ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "distributor:", err)
	if errors.Is(err, distributormain.ErrUsage) {
		os.Exit(2)
	}
	os.Exit(1)
}
