// Command kvload fills, drives and checks the example key-value store. See kvload --help.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/internal/cli"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcheck"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/loadgen"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/logging"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/sourceflag"
)

// errNotConverged makes check exit with status 1 after printing its report.
var errNotConverged = errors.New("not converged")

func main() {
	cli.Main("kvload", func(ctx context.Context) error { return command(os.Stdout).ExecuteContext(ctx) })
}

// options are the flags every subcommand shares.
type options struct {
	endpoints []string
	prefix    string
	assigners []string
	keys      int
	logLevel  string
	tls       mtls.Config
}

// source loads the TLS files, nil meaning plaintext.
func (o *options) source() (*mtls.Source, error) { return o.tls.Load() }

// clientTLS returns the files as the Go client takes them.
func (o *options) clientTLS() client.TLS {
	return client.TLS{Cert: o.tls.Cert, Key: o.tls.Key, CA: o.tls.CA}
}

func (o *options) etcd(ctx context.Context) (*clientv3.Client, error) {
	src, err := o.source()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: o.endpoints, DialTimeout: 5 * time.Second, Context: ctx,
		TLS: src.ClientTLS(), Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd %v: %w", o.endpoints, err)
	}
	return cli, nil
}

func command(out io.Writer) *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "kvload",
		Short: "Fill, drive and check the example key-value store",
		Long: `kvload works the example key-value store from outside, as its users would:
fill writes items to the data source (the etcd prefix the assigner reads), run
keeps reading keys through the router client with a skewed, optionally shifting
popularity (and keeps rewriting some), and check waits until every node holds
exactly what it must.

With --tls-cert, --tls-key and --tls-ca it speaks mutual TLS to etcd, the assigners and
the nodes (https); a router's certificate reads the map, a viewer's or an admin's
can run check too.`,
		SilenceUsage: true, SilenceErrors: true,
	}
	f := cmd.PersistentFlags()
	f.StringSliceVar(&o.endpoints, "etcd-endpoints", []string{"http://127.0.0.1:2379"}, "etcd endpoints of the cluster")
	f.StringVar(&o.prefix, "prefix", "/sliceplane/", "the cluster's etcd prefix, as given to the assigner (items live under PREFIX/data/)")
	f.StringSliceVar(&o.assigners, "assigners", []string{"127.0.0.1:7070"}, "gRPC addresses of the assigners")
	f.IntVar(&o.keys, "keys", 10000, "number of keys, key-0 to key-(N-1)")
	f.StringVar(&o.logLevel, "log-level", "warn", "debug, info, warn or error")
	o.tls.AddFlags(f, false)
	cmd.AddCommand(fillCommand(o, out), runCommand(o, out), checkCommand(o, out))
	return cmd
}

func fillCommand(o *options, out io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:     "fill",
		Short:   "Write every key once",
		Example: `  kvload fill --keys 100000`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cli, err := o.etcd(cmd.Context())
			if err != nil {
				return err
			}
			defer cli.Close()
			g, err := loadgen.New(loadgen.Config{Writer: writer.New(cli, o.prefix+"data/"), Keys: o.keys})
			if err != nil {
				return err
			}
			start := time.Now()
			clock, err := g.Fill(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "wrote %d items in %s; clock %d\n", o.keys, time.Since(start).Round(time.Millisecond), clock)
			return nil
		},
	}
}

func runCommand(o *options, out io.Writer) *cobra.Command {
	cfg := loadgen.Config{}
	var duration time.Duration
	var fill bool
	var policy string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Read keys through the router, and rewrite some, until stopped",
		Long: `run reads keys through the router, trying a key's other replicas when one does not
answer, and rewrites (or deletes, --delete-share) some, until stopped. It then
prints its counts: each read is a hit, a miss (a key that exists answered "not
found"), absent (a key deleted or never written answered "not found") or failed
(no replica answered); misdirected, stale (beyond the node's freshness bound) and
errors count the replicas that did not answer on the way. Without --fill, the
keys are taken as written before (kvload fill).`,
		Example: `  kvload run --workload hotspot-shift:1.1:30 --rate 1000 --write-rate 20
  kvload run --fill --workload zipf:1.2 --duration 1m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log, err := logging.New(os.Stderr, o.logLevel, "text")
			if err != nil {
				return err
			}
			pol, err := client.ParsePolicy(policy)
			if err != nil {
				return err
			}
			cli, err := o.etcd(ctx)
			if err != nil {
				return err
			}
			defer cli.Close()
			router, err := client.NewRouter(client.RouterConfig{Assigners: o.assigners, Policy: pol, TLS: o.clientTLS(), Logger: log})
			if err != nil {
				return err
			}
			src, err := o.source()
			if err != nil {
				return err
			}
			cfg.Writer, cfg.Router, cfg.Keys, cfg.Logger = writer.New(cli, o.prefix+"data/"), router, o.keys, log
			cfg.HTTP = kvclient.HTTPClient(src, 5*time.Second)
			// Without --fill, kvload fill wrote the keys before: a key read as not found is a miss.
			cfg.Filled = !fill
			g, err := loadgen.New(cfg)
			if err != nil {
				return err
			}
			if fill {
				if _, err := g.Fill(ctx); err != nil {
					return err
				}
			}
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			return runRouted(ctx, router, g, out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Workload, "workload", "zipf:1.1", "key popularity, as slicectl sim's --workload")
	f.DurationVar(&cfg.Epoch, "epoch", time.Second, "wall time of one workload epoch")
	f.Float64Var(&cfg.ReadRate, "rate", 500, "reads per second")
	f.Float64Var(&cfg.WriteRate, "write-rate", 10, "writes per second")
	f.Float64Var(&cfg.DeleteShare, "delete-share", 0, "share of the writes that delete their key (0 to 1)")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the popular keys and random choices")
	f.DurationVar(&duration, "duration", 0, "stop after this long (0: until interrupted)")
	f.BoolVar(&fill, "fill", false, "write every key once first")
	f.StringVar(&policy, "policy", "least-outstanding", "how to pick a replica: "+strings.Join(client.Policies(), ", "))
	return cmd
}

// runRouted runs the router and the load through it until ctx ends or the load fails, then
// prints the load's stats. The load waits for the router's first map (no stats without one),
// and the router is stopped and waited for before returning so no goroutine outlives the
// command.
func runRouted(ctx context.Context, router *client.Router, g *loadgen.Generator, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	routed := make(chan error, 1)
	go func() { routed <- router.Run(ctx) }()
	if err := router.WaitReady(ctx); err != nil {
		cancel()
		<-routed
		return fmt.Errorf("waiting for the map: %w", err)
	}
	err := g.Run(ctx)
	cancel()
	if rerr := <-routed; err == nil {
		err = rerr
	}
	s := g.Stats()
	fmt.Fprintf(out, "reads=%d hits=%d misses=%d absent=%d failed=%d misdirected=%d stale=%d errors=%d writes=%d deletes=%d write-errors=%d\n",
		s.Reads, s.Hits, s.Misses, s.Absent, s.Failed, s.Misdirected, s.Stale, s.Errors, s.Writes, s.Deletes, s.WriteErrors)
	return err
}

func checkCommand(o *options, out io.Writer) *cobra.Command {
	var nodes []string
	var timeout time.Duration
	var data sourceflag.Options
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Wait until every node holds exactly what it must",
		Long: `check compares what every node holds (asked over HTTP) with the data source
and the assigner's map, until they agree or --timeout passes: it prints the
report of Sliceplane's convergence checker (items missing, leaked or stale) and
exits 0 when nothing is lost or leaked, 1 otherwise. Stop writers first.`,
		Example: `  kvload check --nodes http://127.0.0.1:7090,http://127.0.0.1:7091 --timeout 1m
  kvload check --nodes 127.0.0.1:7090,127.0.0.1:7091 --source postgres --pg-dsn postgres://app@db/app --pg-table users ...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(nodes) == 0 {
				return errors.New("--nodes: name every node's HTTP address")
			}
			if err := data.Validate(); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			items, closeItems, err := o.items(ctx, &data)
			if err != nil {
				return err
			}
			defer closeItems()
			src, err := o.source()
			if err != nil {
				return err
			}
			conn, err := dial.Leader(o.assigners, src.DialOption("assigner"))
			if err != nil {
				return err
			}
			defer conn.Close()
			c := &kvcheck.Checker{Source: items, Assigner: conn}
			hc := kvclient.HTTPClient(src, 30*time.Second)
			for _, n := range nodes {
				c.Nodes = append(c.Nodes, kvclient.New(n, hc))
			}
			r, err := c.Wait(ctx)
			fmt.Fprintln(out, r)
			if err != nil {
				return fmt.Errorf("%w: %w", errNotConverged, err)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&nodes, "nodes", nil, "addresses of every node (host:port, or a URL; https with --tls-*)")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait")
	data.AddFlags(cmd.Flags())
	return cmd
}

// items opens the data source the check compares the nodes with: the etcd prefix, or the
// PostgreSQL table of --source postgres; the returned function closes it.
func (o *options) items(ctx context.Context, data *sourceflag.Options) (source.Writer, func(), error) {
	pg, err := data.Open(ctx, "", nil, nil)
	if err != nil {
		return nil, nil, err
	}
	if pg != nil {
		return pg, pg.Close, nil
	}
	cli, err := o.etcd(ctx)
	if err != nil {
		return nil, nil, err
	}
	return source.NewEtcd(cli, o.prefix+"data/"), func() { cli.Close() }, nil
}
