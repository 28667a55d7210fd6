// Package healthcheck asks a process once whether it serves: an HTTP endpoint that answers
// 2xx, or a gRPC server whose health service reports SERVING. The image's probe binary, the
// example cluster's launcher and the chaos suite all ask the same way.
//
// Against a server with mutual TLS the probe presents a client certificate: pass the
// *tls.Config of the prober's identity (mtls.Source.ClientTLS, with no kinds: any identity
// of the trust domain may answer a probe). A nil config means plaintext.
package healthcheck

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// HTTP reports whether a GET of url answers with a 2xx status, over plaintext or a TLS
// without a client certificate.
func HTTP(ctx context.Context, url string) error { return HTTPTLS(ctx, url, nil) }

// HTTPTLS is HTTP over TLS presenting the certificate of conf (nil: as HTTP). With a conf,
// an http:// url is asked over https: a certificate is only ever presented over TLS, and
// a probe's command line then needs only the TLS flags added.
func HTTPTLS(ctx context.Context, url string, conf *tls.Config) error {
	if rest, ok := strings.CutPrefix(url, "http://"); ok && conf != nil {
		url = "https://" + rest
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	client := http.DefaultClient
	if conf != nil {
		// A client per probe: a probe runs once, and the process's certificate may rotate.
		tr := &http.Transport{TLSClientConfig: conf, ForceAttemptHTTP2: true}
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr}
	}
	resp, err := client.Do(req)
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
// whole) is SERVING, over plaintext.
func GRPC(ctx context.Context, addr, service string, opts ...grpc.CallOption) error {
	return GRPCTLS(ctx, addr, service, nil, opts...)
}

// GRPCTLS is GRPC over TLS with the certificate of conf (nil: plaintext, as GRPC).
func GRPCTLS(ctx context.Context, addr, service string, conf *tls.Config, opts ...grpc.CallOption) error {
	creds := insecure.NewCredentials()
	if conf != nil {
		creds = credentials.NewTLS(conf)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
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
