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
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
		err = probeHTTP(ctx, target)
	case "grpc":
		err = probeGRPC(ctx, target, *service)
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

func probeHTTP(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errors.New(resp.Status)
	}
	return nil
}

func probeGRPC(ctx context.Context, addr, service string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("service %q is %s", service, st)
	}
	return nil
}
