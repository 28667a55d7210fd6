// Package counterproxy is the example counter's proxy: it sends each request to the member
// that serves its key, through the Go router (client.Transport): an increment to the key's
// primary, a read to a replica. A request the members cannot take now (a primary handed
// over, a member restarting) is tried again until the request's deadline.
package counterproxy

import (
	"errors"
	"net/http"
	"net/http/httputil"
	"strings"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/counter/countermember"
)

// New returns the proxy's handler: members are reached with base (nil: the default
// transport) over scheme ("http" or "https").
func New(r *client.Router, base http.RoundTripper, scheme string) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = scheme, "member" // the transport names the member
		},
		Transport: &client.Transport{Router: r, Base: base, Key: key},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			code := http.StatusBadGateway
			if errors.Is(err, client.ErrNoKey) {
				code = http.StatusNotFound
			}
			http.Error(w, "counterproxy: "+err.Error(), code)
		},
	}
}

// key returns a request's key, from its path, and whether it increments.
func key(r *http.Request) ([]byte, bool, error) {
	switch {
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, countermember.IncrPath):
		return []byte(strings.TrimPrefix(r.URL.Path, countermember.IncrPath)), true, nil
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, countermember.CountPath):
		return []byte(strings.TrimPrefix(r.URL.Path, countermember.CountPath)), false, nil
	}
	return nil, false, errors.New("want POST " + countermember.IncrPath + "KEY or GET " + countermember.CountPath + "KEY")
}
