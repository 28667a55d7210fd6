// Command kvnode runs a storage node of the example key-value store. See kvnode --help.
package main

import (
	"context"
	"os"
	"time"

	"github.com/sliceplane/sliceplane/internal/cli"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvnode"
	"github.com/sliceplane/sliceplane/internal/logging"
)

func main() {
	cli.Main("kvnode", func(ctx context.Context) error { return command().ExecuteContext(ctx) })
}

func command() *cobra.Command {
	var cfg kvnode.Config
	var logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "kvnode",
		Short: "Run a node of the example sharded key-value store",
		Long: `kvnode is a storage node of the example key-value store. It embeds Sliceplane's
node client: it registers with the assigner, pulls the items of its slices from its
distributor into an on-disk store (--data-dir), and serves them over HTTP:

  GET /v1/kv/KEY   the item's value (404 if the node owns the key but has no item;
                   421 with the owners as JSON if another node owns it)
  GET /v1/state    the node's ID, clock, cursor and slices
  GET /v1/items    every item held, one JSON object per line (for checks)
  GET /metrics     Prometheus metrics;  GET /healthz

Every read counts as one unit of load on the key's slice. Restarted with the same
--id and --data-dir, a node resumes from where it stopped. On SIGTERM it drains: its
slices move to other nodes make-before-break while it serves them, for at most
--drain-timeout, and then it stops.

With --tls-cert, --tls-key and --tls-ca (a certificate naming
spiffe://sliceplane/node/ID, or with --target spiffe://sliceplane/target/TARGET/node/ID),
the node dials the assigners and its distributor with
mutual TLS and serves its HTTP API over TLS, requiring a client certificate from the
same CA. Without them it serves plaintext, on loopback only unless --insecure.`,
		Example: `  kvnode --id n1 --listen 127.0.0.1:7090 --data-dir /tmp/kv/n1
  curl http://127.0.0.1:7090/v1/kv/key-42
  kvnode --id n1 --data-dir /tmp/kv/n1 --tls-cert certs/node-n1.crt --tls-key certs/node-n1.key --tls-ca certs/ca.crt
  curl --cacert certs/ca.crt --cert certs/admin-alice.crt --key certs/admin-alice.key https://127.0.0.1:7090/v1/kv/key-42`,
		Args:         cobra.NoArgs,
		SilenceUsage: true, SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logging.New(os.Stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Logger = log
			srv, err := kvnode.New(cfg)
			if err != nil {
				return err
			}
			return srv.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.ID, "id", "", "node ID; keep it across restarts (required)")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7090", "HTTP address to serve on")
	f.StringVar(&cfg.Advertise, "advertise", "", "address routers should use (default: the bound address)")
	f.StringSliceVar(&cfg.Assigners, "assigners", []string{"127.0.0.1:7070"}, "gRPC addresses of the assigners")
	f.StringVar(&cfg.Target, "target", "", "the sharded service the node belongs to (default: the control plane's default target); its certificate must name it, spiffe://sliceplane/target/TARGET/node/ID")
	f.StringVar(&cfg.DataDir, "data-dir", "kvnode-data", "directory of the node's store")
	f.Float64Var(&cfg.Capacity, "capacity", 1, "the node's capacity relative to others")
	f.DurationVar(&cfg.ReportInterval, "report-interval", time.Second, "time between load reports")
	f.DurationVar(&cfg.DrainTimeout, "drain-timeout", 60*time.Second, "on SIGTERM, how long the node may take to hand its slices off (serving them until each is) before it stops; 0: stop at once")
	f.DurationVar(&cfg.StallTimeout, "stall-timeout", 5*time.Second, "how long the pull stream may stay silent before the node reconnects and reports its data stale")
	f.DurationVar(&cfg.FreshnessBound, "freshness-bound", 3*time.Second, "how far behind its source the node's data may be for it to answer reads; beyond it, reads get 503")
	cfg.TLS.AddFlags(f, true)
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	cmd.MarkFlagRequired("id") //nolint:errcheck // the flag exists
	return cmd
}
