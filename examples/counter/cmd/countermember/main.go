// Command countermember runs a member of the example sharded counter. See countermember --help.
package main

import (
	"context"
	"os"
	"time"

	"github.com/sliceplane/sliceplane/internal/cli"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/examples/counter/countermember"
	"github.com/sliceplane/sliceplane/internal/logging"
)

func main() {
	cli.Main("countermember", func(ctx context.Context) error { return command().ExecuteContext(ctx) })
}

func command() *cobra.Command {
	var cfg countermember.Config
	var logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "countermember",
		Short: "Run a member of the example sharded counter",
		Long: `countermember is a member of the example sharded counter: it embeds Sliceplane's
client.Member in a cluster run with --roles primary-secondary, keeps the counts of
the keys it owns in memory, loads them from the counters table of --pg-dsn when it
acquires a range or becomes its primary, and writes each increment through before
answering:

  POST /v1/incr/KEY    {"key":"KEY","count":N}, on the key's primary
  GET  /v1/count/KEY   the key's count, on any replica
  GET  /healthz

A request for a key it does not serve in that role gets 421 and changed nothing. On
SIGTERM it drains: its primaries demote and its ranges move make-before-break while
it serves, for at most --drain-timeout.

With --tls-cert, --tls-key and --tls-ca (a certificate naming
spiffe://sliceplane/node/ID, or with --target spiffe://sliceplane/target/TARGET/node/ID)
it dials the assigners with mutual TLS and serves its
API over TLS, requiring a client certificate from the same CA.`,
		Example: `  countermember --id c1 --listen 127.0.0.1:7095 --pg-dsn postgres://localhost/counter
  curl -X POST http://127.0.0.1:7095/v1/incr/visits`,
		Args:         cobra.NoArgs,
		SilenceUsage: true, SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logging.New(os.Stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Logger = log
			srv, err := countermember.New(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return srv.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.ID, "id", "", "member ID; keep it across restarts (required)")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7095", "HTTP address to serve on")
	f.StringVar(&cfg.Advertise, "advertise", "", "address the proxy should use (default: the bound address)")
	f.StringSliceVar(&cfg.Assigners, "assigners", []string{"127.0.0.1:7070"}, "gRPC addresses of the assigners")
	f.StringVar(&cfg.Target, "target", "", "the sharded service the member belongs to (default: the control plane's default target); its certificate must name it, spiffe://sliceplane/target/TARGET/node/ID")
	f.StringVar(&cfg.DSN, "pg-dsn", "", "PostgreSQL connection string of the database holding the counters table (created if missing; required)")
	f.DurationVar(&cfg.ReportInterval, "report-interval", time.Second, "time between load reports")
	f.DurationVar(&cfg.DrainTimeout, "drain-timeout", 60*time.Second, "on SIGTERM, how long the member may take to hand its ranges over before it stops; 0: stop at once")
	f.DurationVar(&cfg.WriteDelay, "write-delay", 0, "added to every increment's write, as a slower database would")
	f.BoolVar(&cfg.Plain, "plain-writes", false, "write increments without the fence (for a cluster without --exclusive: shows what a stale primary does)")
	cfg.TLS.AddFlags(f, true)
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	cmd.MarkFlagRequired("id")     //nolint:errcheck // the flag exists
	cmd.MarkFlagRequired("pg-dsn") //nolint:errcheck // the flag exists
	return cmd
}
