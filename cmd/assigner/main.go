// Command assigner runs a Sliceplane assigner. See assigner --help.
package main

import (
	"github.com/sliceplane/sliceplane/internal/assignermain"
	"github.com/sliceplane/sliceplane/internal/cli"
)

func main() {
	cli.Main("assigner", assignermain.NewCommand().ExecuteContext)
}
