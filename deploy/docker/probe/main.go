// Command probe is the health check baked into every Sliceplane image. The images are built
// FROM scratch, with no shell, curl or grpc_health_probe, so compose healthchecks and scripts
// run this instead:
//
//	probe http http://127.0.0.1:7090/healthz         # exit 0 on a 2xx answer
//	probe grpc 127.0.0.1:7070                         # gRPC health, overall status
//	probe grpc 127.0.0.1:7070 -service sliceplane.leader   # 0 only on the leading assigner
//
// It prints one line saying what it saw; exit status 0 means healthy, 1 unhealthy or
// unreachable, 2 a usage error.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/sliceplane/sliceplane/internal/healthcheck"
)

const usageText = `usage:
  probe http URL [-timeout 3s]
  probe grpc HOST:PORT [-service NAME] [-timeout 3s]
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, out, errOut io.Writer) int {
	if len(args) < 2 {
		fmt.Fprint(errOut, usageText)
		return 2
	}
	kind, target := args[0], args[1]
	fs := flag.NewFlagSet("probe "+kind, flag.ContinueOnError)
	fs.SetOutput(errOut)
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	service := fs.String("service", "", "gRPC health service name (grpc only; empty: the server as a whole)")
	if err := fs.Parse(args[2:]); err != nil || fs.NArg() != 0 {
		fmt.Fprint(errOut, usageText)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	switch kind {
	case "http":
		err = healthcheck.HTTP(ctx, target)
	case "grpc":
		err = healthcheck.GRPC(ctx, target, *service, grpc.WaitForReady(true))
	default:
		fmt.Fprint(errOut, usageText)
		return 2
	}
	if err != nil {
		fmt.Fprintf(out, "unhealthy: %s: %v\n", target, err)
		return 1
	}
	fmt.Fprintf(out, "healthy: %s\n", target)
	return 0
}
