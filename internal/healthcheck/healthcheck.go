// Package healthcheck asks a process once whether it serves: an HTTP endpoint that answers
// 2xx, or a gRPC server whose health service reports SERVING. The image's probe binary, the
// example cluster's launcher and the chaos suite all ask the same way.
package healthcheck

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// HTTP reports whether a GET of url answers with a 2xx status.
func HTTP(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // lets the connection be reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("healthcheck: %s: %s", url, resp.Status)
	}
	return nil
}

// GRPC reports whether the gRPC server at addr says that service ("" for the server as a
// whole) is SERVING.
func GRPC(ctx context.Context, addr, service string, opts ...grpc.CallOption) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, opts...)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("healthcheck: service %q is %s", service, st)
	}
	return nil
}
