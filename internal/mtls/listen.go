package mtls

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"
)

// InsecureWarnEvery is how often a server that listens without TLS off loopback says so.
const InsecureWarnEvery = time.Minute

// Loopback reports whether addr (host:port) listens on loopback only. An empty host, as in
// ":7070", listens on every interface.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckListen refuses a server that would listen on a non-loopback addr without TLS, unless
// the process was given --insecure: closed by default. what names the endpoint in the error.
func CheckListen(s *Source, insecure bool, what, addr string) error {
	if s != nil || insecure || Loopback(addr) {
		return nil
	}
	return fmt.Errorf("%w: refusing to serve %s on %s without TLS: give --tls-cert, --tls-key and --tls-ca "+
		"(slicectl certs init makes a development set), listen on loopback, or pass --insecure", ErrConfig, what, addr)
}

// WarnPlaintext logs that a server listens without TLS: once for loopback, and every
// InsecureWarnEvery until ctx ends for any other address (allowed by --insecure). It
// returns at once when there is nothing to repeat, so it can run as one of a server's
// goroutines either way.
func WarnPlaintext(ctx context.Context, log *slog.Logger, s *Source, what, addr string) {
	if s != nil {
		return
	}
	if Loopback(addr) {
		log.Warn("serving without TLS on loopback: fine for development, never for a network", "endpoint", what, "addr", addr)
		return
	}
	t := time.NewTicker(InsecureWarnEvery)
	defer t.Stop()
	for {
		log.Warn("serving WITHOUT TLS on a network address (--insecure): anyone who reaches it can call it", "endpoint", what, "addr", addr)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// CheckEndpoints refuses http:// etcd endpoints when s is not nil: the etcd client would
// drop the TLS of such an endpoint without a word.
func CheckEndpoints(s *Source, endpoints []string) error {
	if s == nil {
		return nil
	}
	for _, e := range endpoints {
		if strings.HasPrefix(e, "http://") {
			return fmt.Errorf("%w: --etcd-endpoints %s: with TLS the etcd client speaks https only; give https:// endpoints", ErrConfig, e)
		}
	}
	return nil
}
