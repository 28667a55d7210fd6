package client

// TLS names the PEM files of a client's mutual TLS: its certificate and key (whose URI SAN
// names it, spiffe://sliceplane/node/<id> for a node) and the CA it trusts. The files are
// re-read when they change, so certificates rotate without a restart. The zero TLS means
// plaintext, which only a server on loopback (or one run with --insecure) accepts.
type TLS struct {
	Cert, Key, CA string
}
