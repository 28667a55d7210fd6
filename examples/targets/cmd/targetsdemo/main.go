// Command targetsdemo runs the two-target demo (DEMO_APP=both make demo). See targetsdemo
// --help.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/examples/internal/democli"
	"github.com/sliceplane/sliceplane/examples/targets/demo"
	"github.com/sliceplane/sliceplane/internal/cli"
)

func main() { cli.Exit("targetsdemo", command().Execute()) }

const longHelp = `targetsdemo starts, on loopback, one control plane (an embedded etcd and two
assigners) serving two sharded services as two targets, and runs the demo of each
against it, side by side: the example key-value store (kvdemo) as the default target,
with two distributors and four nodes, and the example sharded counter (counterdemo)
as target "counter", with three members on a throwaway PostgreSQL server (its
binaries must be installed). The counter's roles (primary-secondary), exclusive
primaries and lease are its target's config, in the assigners' targets file: the
key-value store's are the assigners' flags. Every link is mutual TLS, each node and
member with a certificate confined to its target.

It first says where everything runs; each demo's lines begin with its name. The
line beginning "  inspect:" is a slicectl command, with an admin's certificate that
acts in every target, that lists the targets with their leaders.

It stops after --duration (default: $DEMO_SECONDS seconds, else at Ctrl-C), runs each
demo's check, and prints each demo's final line:
  final imbalance=X.XX items=N lost=0 misses=N failed=N
  final imbalance=X keys=K acked=A stored=S duplicates=D skipped=S2 failed=F
and fails if either check does. A second Ctrl-C abandons the checks.`

func command() *cobra.Command {
	cfg := demo.Config{Out: os.Stdout}
	var keep bool
	var logLevel string
	cmd := &cobra.Command{
		Use:          "targetsdemo",
		Short:        "Run the two-target demo: the key-value store and the counter on one control plane",
		Long:         longHelp,
		Example:      "  DEMO_APP=both make demo\n  DEMO_APP=both DEMO_SECONDS=30 make demo",
		Args:         cobra.NoArgs,
		SilenceUsage: true, SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := democli.Setup(cmd, logLevel, &cfg.Duration)
			if err != nil {
				return err
			}
			cfg.Log = log
			if cfg.Dir, err = os.MkdirTemp("", "sliceplane-targets-"); err != nil {
				return err
			}
			if !keep {
				defer os.RemoveAll(cfg.Dir)
			}
			if cfg.Bin, err = filepath.Abs(cfg.Bin); err != nil {
				return err
			}
			return run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Bin, "bin", "bin", "directory of the binaries: assigner, distributor, slicectl, kvnode, countermember")
	f.BoolVar(&keep, "keep", false, "keep the temporary directory (logs, data) at the end")
	f.DurationVar(&cfg.Duration, "duration", 0, "stop after this long (default: $DEMO_SECONDS seconds, else at Ctrl-C)")
	f.IntVar(&cfg.KV.Keys, "keys", 10000, "number of items of the key-value store")
	f.Float64Var(&cfg.KV.ReadRate, "rate", 1000, "reads per second of the key-value store")
	f.Float64Var(&cfg.KV.WriteRate, "write-rate", 20, "writes per second of the key-value store")
	f.IntVar(&cfg.Counter.Keys, "counters", 100, "number of counters")
	f.Float64Var(&cfg.Counter.Rate, "increments", 200, "increments per second of the counter")
	f.DurationVar(&cfg.Counter.WriteDelay, "write-delay", 2*time.Millisecond, "added to every increment's write, as a slower database would")
	f.StringVar(&logLevel, "log-level", "warn", "the demo's own diagnostics: debug, info, warn or error")
	return cmd
}

// run runs the demo and prints each demo's final line; the first Ctrl-C ends the loads and
// starts the checks, the second abandons them.
func run(ctx context.Context, cfg demo.Config) error {
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	ctx, abandon := context.WithCancel(ctx)
	defer abandon()
	cfg.Stop = democli.TwoStages(ctx, signals, abandon)
	s, err := demo.Run(ctx, cfg)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return errors.New("abandoned")
		}
		return err
	}
	fmt.Println(s.KV)
	fmt.Println(s.Counter)
	return s.Err()
}
