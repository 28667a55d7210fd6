// Command ratelimitmember runs a member of the example rate limiter. See ratelimitmember --help.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/sliceplane/sliceplane/internal/cli"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/ratelimit/ratelimiter"
	"github.com/sliceplane/sliceplane/internal/logging"
)

func main() {
	cli.Main("ratelimitmember", func(ctx context.Context) error { return command().ExecuteContext(ctx) })
}

func command() *cobra.Command {
	var cfg ratelimiter.Config
	var logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "ratelimitmember",
		Short: "Run a member of the example sharded rate limiter",
		Long: `ratelimitmember is a member of the example rate limiter: it embeds Sliceplane's
client.Member, keeps a token bucket per key in memory (--rate tokens a second, up
to --burst) for the keys whose ranges it is the primary of, and serves the gRPC API
ratelimit.v1.RateLimitService and the standard gRPC health service:

  Take(key, tokens)   takes tokens from the key's bucket, all or none; on its primary
  Peek(key)           what the key's bucket holds; on any replica

A call for a key it does not serve in the role it needs is answered NotOwner
(FailedPrecondition) and changed nothing: a caller routing with Sliceplane's
client.GRPCDialOptions sends it again where its map says. Buckets do not move with
their range: a key's new primary starts its bucket full.

Run the assigners with --roles primary-secondary (or give --roles replicas to both,
and every replica of a key keeps a bucket of its own). On SIGTERM it drains: its
primaries demote and its ranges move make-before-break while it serves, for at most
--drain-timeout; a second SIGTERM or Ctrl-C stops it at once.

With --tls-cert, --tls-key and --tls-ca (a certificate naming
spiffe://sliceplane/node/ID) it dials the assigners with mutual TLS and serves its
API over TLS, requiring a client certificate from the same CA. Without them it
serves plaintext, on loopback only unless --insecure.`,
		Example: `  assigner --roles primary-secondary
  ratelimitmember --id r1 --listen 127.0.0.1:7096
  ratelimitmember --id r2 --listen 127.0.0.1:7097 --rate 100 --burst 200
  ratelimit take visits`,
		Args:         cobra.NoArgs,
		SilenceUsage: true, SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !(cfg.Rate > 0) || !(cfg.Burst >= 1) { // the config's zero means its default; a flag's does not
				return fmt.Errorf("--rate must be above 0 and --burst at least 1, not %g and %g", cfg.Rate, cfg.Burst)
			}
			log, err := logging.New(os.Stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Logger = log
			srv, err := ratelimiter.New(cfg)
			if err != nil {
				return err
			}
			log.Info("serving", "member", cfg.ID, "addr", srv.Addr(), "rate", cfg.Rate, "burst", cfg.Burst)
			return srv.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.ID, "id", "", "member ID; keep it across restarts (required)")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7096", "gRPC address to serve on")
	f.StringVar(&cfg.Advertise, "advertise", "", "address routers should use (default: the bound address)")
	f.StringSliceVar(&cfg.Assigners, "assigners", []string{"127.0.0.1:7070"}, "gRPC addresses of the assigners")
	cfg.TLS.AddFlags(f, true)
	f.StringVar(&cfg.Roles, "roles", ratelimiter.DefaultRoles, "the cluster's role model, as the assigners' --roles: "+
		client.RolesPrimarySecondary+" (a key's primary keeps its bucket) or "+client.RolesReplicas+" (every replica keeps one)")
	f.Float64Var(&cfg.Rate, "rate", ratelimiter.DefaultRate, "tokens a second that fill each key's bucket")
	f.Float64Var(&cfg.Burst, "burst", ratelimiter.DefaultBurst, "tokens a key's bucket holds at most, and holds when it starts")
	f.DurationVar(&cfg.DrainTimeout, "drain-timeout", 60*time.Second, "on SIGTERM, how long the member may take to hand its ranges over before it stops; 0: stop at once")
	f.DurationVar(&cfg.ReportInterval, "report-interval", time.Second, "time between load reports")
	f.IntVar(&cfg.ConcurrentCalls, "concurrent-calls", client.DefaultConcurrentCalls, "how many of the member's calls about disjoint ranges (acquire, release, role change) may run at once")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	cmd.MarkFlagRequired("id") //nolint:errcheck // the flag exists
	return cmd
}
