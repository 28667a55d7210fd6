package authz

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/sliceplane/sliceplane/internal/target"
)

// HTTP guards next, served under path, as the gRPC interceptors guard a method: the caller's
// certificate (which the TLS handshake of the server's HTTP listener already asked for and
// verified) must name an identity with role. A refusal is a 401 or 403 with a JSON body
// that says why, counted in the same metric as the gRPC refusals with path as the method.
// Without TLS every request is let through, as every call is.
func (a *Authorizer) HTTP(path string, role Role, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.tls == nil {
			next.ServeHTTP(w, r)
			return
		}
		if r.TLS == nil {
			a.refuseHTTP(w, path, ReasonUnauthenticated, http.StatusUnauthorized, "authz: the connection is not TLS")
			return
		}
		id, err := a.tls.VerifyClient(r.TLS.PeerCertificates)
		if err != nil {
			a.refuseHTTP(w, path, ReasonUnauthenticated, http.StatusUnauthorized, fmt.Sprintf("authz: %v", err))
			return
		}
		in := target.Name(r.URL.Query().Get("target"))
		if why := confined(id, a.policy.Scope(id), Rule{}, in); why != "" {
			a.refuseHTTP(w, path, ReasonTarget, http.StatusForbidden, fmt.Sprintf("authz: %s may not open %s of target %q: %s", id, path, in, why))
			return
		}
		if roles := a.policy.Roles(id); !roles.has(role) {
			a.refuseHTTP(w, path, ReasonRole, http.StatusForbidden,
				fmt.Sprintf("authz: %s (roles %s) may not open %s: it needs the role %s", id, roles, path, role))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *Authorizer) refuseHTTP(w http.ResponseWriter, path, reason string, code int, msg string) {
	msg = a.deny(path, reason, msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg}) //nolint:errcheck // the client may be gone
}
