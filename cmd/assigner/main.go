// Command assigner runs a Sliceplane assigner. See assigner --help.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sliceplane/sliceplane/internal/assignermain"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := assignermain.NewCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "assigner:", err)
		os.Exit(1)
	}
}
