// Command kvproxy routes reads of the example key-value store to the nodes that hold them.
// See kvproxy --help.
package main

import (
	"context"
	"os"
	"strings"

	"github.com/sliceplane/sliceplane/internal/cli"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvproxy"
	"github.com/sliceplane/sliceplane/internal/logging"
)

func main() {
	cli.Main("kvproxy", func(ctx context.Context) error { return command().ExecuteContext(ctx) })
}

func command() *cobra.Command {
	var cfg kvproxy.Config
	var policy, logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "kvproxy",
		Short: "Route reads of the example key-value store to the nodes holding them",
		Long: `kvproxy serves GET /v1/kv/KEY like a node does, for any key: it finds the replicas
of the key's slice with Sliceplane's router client (no network call per lookup),
picks one by --policy, and forwards the read. A node that answers "not mine" (the
proxy is a step behind the map) names the owners, and the read goes there once.

With --tls-cert, --tls-key and --tls-ca (a router's certificate, e.g.
spiffe://sliceplane/router/proxy), it serves over TLS requiring client certificates
of the same CA, and speaks mutual TLS to the assigners and the nodes.`,
		Example: `  kvproxy --listen 127.0.0.1:7095 --policy least-outstanding
  curl http://127.0.0.1:7095/v1/kv/key-42`,
		Args:         cobra.NoArgs,
		SilenceUsage: true, SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logging.New(os.Stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			if cfg.Policy, err = client.ParsePolicy(policy); err != nil {
				return err
			}
			cfg.Logger = log
			p, err := kvproxy.New(cfg)
			if err != nil {
				return err
			}
			return p.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7095", "HTTP address to serve on")
	f.StringSliceVar(&cfg.Assigners, "assigners", []string{"127.0.0.1:7070"}, "gRPC addresses of the assigners")
	f.StringVar(&policy, "policy", "least-outstanding", "how to pick a replica: "+strings.Join(client.Policies(), ", "))
	cfg.TLS.AddFlags(f, true)
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}
