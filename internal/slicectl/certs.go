package slicectl

import "github.com/spf13/cobra"

func newCertsCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Make and read the certificates of a cluster with mutual TLS",
		Long: `certs makes a development certificate authority and the certificates of a
cluster's identities (init), and says what a certificate file holds (show).

Every Sliceplane process is known by the identity its certificate names, a URI
SAN spiffe://sliceplane/<kind>/<name>: node, distributor, assigner and router for
the processes, admin and viewer for people and tools. The kind is the role: an
admin may override the assignment, a viewer only inspect it.

The CA certs init makes is for laptops, demos and tests; production uses a real
PKI (cert-manager in Kubernetes), whose certificates carry the same URI SANs.`,
		Example: `  # A CA and the certificates of a small cluster, then slicectl as its admin.
  slicectl certs init certs --node n1,n2,n3 --distributor d1 --assigner a1 --admin alice --viewer ci
  slicectl --tls-cert certs/admin-alice.crt --tls-key certs/admin-alice.key --tls-ca certs/ca.crt status

  # What a certificate says, and whether the CA signed it.
  slicectl certs show certs/node-n1.crt --ca certs/ca.crt`,
		Args: cobra.ArbitraryArgs,
		RunE: helpOrUnknown,
	}
	cmd.AddCommand(newCertsInitCommand(g), newCertsShowCommand(g))
	return cmd
}
