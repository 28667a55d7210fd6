// Command distributor runs a Sliceplane distributor. See distributor --help.
package main

import (
	"github.com/sliceplane/sliceplane/internal/cli"
	"github.com/sliceplane/sliceplane/internal/distributormain"
)

func main() {
	cli.Main("distributor", distributormain.NewCommand().ExecuteContext)
}
