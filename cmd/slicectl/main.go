// Command slicectl inspects, steers and simulates Sliceplane. See slicectl --help.
package main

import (
	"context"
	"os"

	"github.com/sliceplane/sliceplane/internal/cli"
	"github.com/sliceplane/sliceplane/internal/slicectl"
)

func main() {
	cli.Main("slicectl", func(ctx context.Context) error {
		return slicectl.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	})
}
