// Command kvdemo runs Sliceplane's one-command demo (make demo). See kvdemo --help.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/sliceplane/sliceplane/internal/cli"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/examples/internal/democli"
	"github.com/sliceplane/sliceplane/examples/kvstore/demo"
)

func main() { cli.Exit("kvdemo", command().Execute()) }

// longHelp is kvdemo --help's description.
const longHelp = `kvdemo starts, on loopback, an embedded etcd, an assigner, two distributors and
four nodes of the example key-value store (separate processes, from the binaries in
--bin), fills the store and reads it with a skewed popularity whose hot keys move
half-way. Every link is mutual TLS: the demo makes a throwaway CA and a
certificate for each process in its directory (--plaintext turns that off), and
prints the slicectl command, with an admin's certificate, to inspect the cluster,
and on a line beginning "web:" the URL of the assigner's web view with that admin's
PKCS#12 file (admin-demo.p12, empty password) to import into a browser.
Every second it prints the load each node serves, the imbalance (busiest
node over the mean), the slices, the churn of the last pass and the items.

With --roll (or DEMO_ROLL=1), a quarter of the way in, every node is restarted in
turn under the load, as a rolling upgrade would: each drains on SIGTERM (its slices
handed off to the others, make-before-break), stops, and starts again with its data.

It stops after --duration (default: $DEMO_SECONDS seconds, or until Ctrl-C), then
freezes the map and checks that every node holds exactly what it must, and prints
  final imbalance=X.XX items=N lost=0 misses=N failed=N
where misses are reads of existing keys answered "not found", and failed are reads
that got no answer from any replica. A second Ctrl-C abandons the check. Every
process is stopped on the way out.`

func command() *cobra.Command {
	cfg := demo.Config{Out: os.Stdout}
	var keep bool
	var logLevel string
	cmd := &cobra.Command{
		Use:   "kvdemo",
		Short: "Run Sliceplane's demo: a balancing cluster of the example key-value store on loopback",
		Long:  longHelp,
		Example: `  make demo                       # builds the binaries and runs this
  DEMO_SECONDS=30 make demo
  DEMO_SECONDS=45 DEMO_ROLL=1 make demo   # a rolling restart of every node under load
  make demo SOURCE=postgres              # the items in a throwaway PostgreSQL table
  kvdemo --bin ./bin --duration 1m --keys 50000`,
		Args:         cobra.NoArgs,
		SilenceUsage: true, SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := democli.Setup(cmd, logLevel, &cfg.Duration)
			if err != nil {
				return err
			}
			cfg.Log = log
			if cfg.Dir == "" {
				if cfg.Dir, err = os.MkdirTemp("", "sliceplane-demo-"); err != nil {
					return err
				}
				if !keep {
					defer os.RemoveAll(cfg.Dir)
				}
			}
			if cfg.Bin, err = filepath.Abs(cfg.Bin); err != nil {
				return err
			}
			// The first Ctrl-C ends the load and starts the final check; the second abandons it.
			signals := make(chan os.Signal, 2)
			signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(signals)
			ctx, abandon := context.WithCancel(cmd.Context())
			defer abandon()
			cfg.Stop = democli.TwoStages(ctx, signals, abandon)
			s, err := demo.Run(ctx, cfg)
			if err != nil {
				if errors.Is(err, context.Canceled) {
					return errors.New("abandoned")
				}
				return err
			}
			fmt.Println(s)
			return s.Err()
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Bin, "bin", "bin", "directory of the binaries: assigner, distributor, slicectl, kvnode")
	f.StringVar(&cfg.Dir, "dir", "", "directory for the demo's data and logs (default: a temporary one, removed at the end)")
	f.BoolVar(&keep, "keep", false, "keep the temporary directory (logs, data) at the end")
	f.DurationVar(&cfg.Duration, "duration", 0, "stop after this long (default: $DEMO_SECONDS seconds, else at Ctrl-C)")
	f.IntVar(&cfg.Keys, "keys", 10000, "number of items")
	f.Float64Var(&cfg.ReadRate, "rate", 1000, "reads per second")
	f.Float64Var(&cfg.WriteRate, "write-rate", 20, "writes per second")
	f.IntVar(&cfg.Nodes, "nodes", 4, "number of nodes")
	f.BoolVar(&cfg.Plaintext, "plaintext", false, "run every link without TLS (default: mutual TLS with a throwaway CA)")
	f.StringVar(&cfg.Source, "source", sourceDefault(), "where the items live: etcd, or postgres (a throwaway PostgreSQL server; needs its binaries) (default: $SOURCE, else etcd)")
	f.BoolVar(&cfg.Roll, "roll", os.Getenv("DEMO_ROLL") == "1", "restart every node in turn under load, each draining on SIGTERM first (default: $DEMO_ROLL=1)")
	f.StringVar(&logLevel, "log-level", "warn", "the demo's own diagnostics: debug, info, warn or error")
	return cmd
}

// sourceDefault is $SOURCE, which make demo passes on (make demo SOURCE=postgres), or etcd.
func sourceDefault() string {
	if s := os.Getenv("SOURCE"); s != "" {
		return s
	}
	return "etcd"
}
