package slicectl

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/sliceplane/sliceplane/internal/mtls"
)

// Errors of a call the server refused for who slicectl is rather than what it asked.
var (
	// ErrPermission is wrapped by the error of a call the server refused to the identity of
	// --tls-cert (PermissionDenied): nothing changed.
	ErrPermission = errors.New("permission denied")
	// ErrUnauthenticated is wrapped by the error of a call the server refused because it
	// could not tell who slicectl is (Unauthenticated): no certificate, an expired one,
	// another CA's.
	ErrUnauthenticated = errors.New("not authenticated")
)

// The environment variables that stand for the TLS flags, so that one line the demo prints
// (an env file, or `export`) serves every later command. A flag given wins.
const (
	envTLSCert = "SLICEPLANE_TLS_CERT"
	envTLSKey  = "SLICEPLANE_TLS_KEY"
	envTLSCA   = "SLICEPLANE_TLS_CA"
)

// tlsFlagsHelp is how the TLS flags are named in advice.
const tlsFlagsHelp = "--tls-cert, --tls-key and --tls-ca (or " + envTLSCert + ", " + envTLSKey + " and " + envTLSCA + ")"

// addTLSFlags registers --tls-cert, --tls-key and --tls-ca on f, defaulting to the
// environment.
func (g *globalOptions) addTLSFlags(f *pflag.FlagSet) {
	g.tls = mtls.Config{Cert: os.Getenv(envTLSCert), Key: os.Getenv(envTLSKey), CA: os.Getenv(envTLSCA)}
	g.tls.AddFlags(f, false)
	for flag, env := range map[string]string{"tls-cert": envTLSCert, "tls-key": envTLSKey, "tls-ca": envTLSCA} {
		f.Lookup(flag).Usage += " (env " + env + ")"
	}
}

// loadTLS loads the TLS files once per command: nil means plaintext. Files that do not go
// together, or do not load, are a usage error.
func (g *globalOptions) loadTLS() (*mtls.Source, error) {
	if g.tlsLoaded {
		return g.tlsSource, nil
	}
	src, err := g.tls.Load()
	if err != nil {
		return nil, usageError(err)
	}
	g.tlsSource, g.tlsLoaded = src, true
	return src, nil
}

// refusal turns a refusal for who slicectl is (code, the status code's name) into the
// error to print, or returns nil. msg is the server's message.
func refusal(code, msg string) error {
	var kind error
	switch code {
	case "PermissionDenied":
		kind = ErrPermission
	case "Unauthenticated":
		kind = ErrUnauthenticated
	default:
		return nil
	}
	if _, desc, ok := strings.Cut(msg, "code = "+code+" desc = "); ok {
		msg = desc
	}
	msg = strings.TrimPrefix(strings.Trim(msg, `"`), "authz: ")
	if kind == ErrUnauthenticated {
		msg += "; give a valid certificate of the cluster's CA with " + tlsFlagsHelp
	}
	return fmt.Errorf("%w: %s", kind, msg)
}

// refusalIn finds a refusal in a connection error's message, or returns nil: a refused
// health check (how the leader is found) is reported by gRPC as the connection's error.
func refusalIn(msg string) error {
	for _, code := range []string{"PermissionDenied", "Unauthenticated"} {
		if strings.Contains(msg, "code = "+code+" ") {
			return refusal(code, msg)
		}
	}
	return nil
}

// tlsMismatch explains a connection that failed because one side speaks TLS and the other
// does not, or returns "". The failure itself says little ("error reading server preface:
// EOF", "first record does not look like a TLS handshake").
func (g *globalOptions) tlsMismatch(cause string) string {
	if strings.Contains(cause, "health check") { // a connection was made: TLS is not the matter
		return ""
	}
	if g.tlsSource != nil {
		if strings.Contains(cause, "first record does not look like a TLS handshake") {
			return "the assigner does not use TLS: drop " + tlsFlagsHelp + ", or give the assigner its certificate"
		}
		return ""
	}
	for _, a := range g.assigners {
		if speaksTLS(strings.TrimSpace(a)) {
			return fmt.Sprintf("the assigner at %s requires TLS: give %s", strings.TrimSpace(a), tlsFlagsHelp)
		}
	}
	return ""
}

// speaksTLS reports whether the server at addr answers a TLS handshake. It checks no
// certificate: it only asks which protocol the server speaks, and sends nothing else.
func speaksTLS(addr string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: &tls.Config{
		InsecureSkipVerify: true, //nolint:gosec // nothing is sent over this connection
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"h2"},
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// etcdWantsTLS reports whether one of the etcd endpoints is https or answers a TLS
// handshake.
func etcdWantsTLS(endpoints []string) bool {
	for _, e := range endpoints {
		e = strings.TrimSpace(e)
		if strings.HasPrefix(e, "https://") {
			return true
		}
		if speaksTLS(strings.TrimPrefix(e, "http://")) {
			return true
		}
	}
	return false
}
