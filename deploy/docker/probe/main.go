// Command probe is the health check baked into every Sliceplane image. The images are built
// FROM scratch, with no shell, curl or grpc_health_probe, so compose healthchecks and scripts
// run this instead:
//
//	probe http http://127.0.0.1:7090/healthz         # exit 0 on a 2xx answer
//	probe grpc 127.0.0.1:7070                         # gRPC health, overall status
//	probe grpc 127.0.0.1:7070 -service sliceplane.leader   # 0 only on the leading assigner
//
// Against a server with mutual TLS it presents the container's own certificate, the files
// the server itself is given (any identity of the CA may ask for health):
//
//	probe grpc 127.0.0.1:7070 -tls-cert /certs/node-n1.crt -tls-key /certs/node-n1.key -tls-ca /certs/ca.crt
//	probe http https://127.0.0.1:7090/healthz -tls-cert ... -tls-key ... -tls-ca ...   # http:// works too
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
	"github.com/sliceplane/sliceplane/internal/mtls"
)

const usageText = `usage:
  probe http URL [-timeout 3s] [-tls-cert FILE -tls-key FILE -tls-ca FILE]
  probe grpc HOST:PORT [-service NAME] [-timeout 3s] [-tls-cert FILE -tls-key FILE -tls-ca FILE]
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
	var tc mtls.Config
	fs.StringVar(&tc.Cert, "tls-cert", "", "PEM client certificate, for a server with mutual TLS (with -tls-key and -tls-ca)")
	fs.StringVar(&tc.Key, "tls-key", "", "PEM private key of -tls-cert")
	fs.StringVar(&tc.CA, "tls-ca", "", "PEM certificate authorities the server's certificate must chain to")
	if err := fs.Parse(args[2:]); err != nil || fs.NArg() != 0 {
		fmt.Fprint(errOut, usageText)
		return 2
	}
	src, err := tc.Load()
	if err != nil {
		fmt.Fprintf(errOut, "probe: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	switch kind {
	case "http":
		err = healthcheck.HTTPTLS(ctx, target, src.ClientTLS())
	case "grpc":
		err = healthcheck.GRPCTLS(ctx, target, *service, src.ClientTLS(), grpc.WaitForReady(true))
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
