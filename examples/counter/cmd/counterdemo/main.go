// Command counterdemo runs the example counter's demo (DEMO_APP=counter make demo). See
// counterdemo --help.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sliceplane/sliceplane/internal/cli"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/examples/counter/demo"
	"github.com/sliceplane/sliceplane/examples/internal/democli"
)

func main() { cli.Exit("counterdemo", command().Execute()) }

const longHelp = `counterdemo starts, on loopback, an embedded etcd, an assigner run with
--roles primary-secondary, a throwaway PostgreSQL server (its binaries must be
installed) and three members of the example sharded counter (countermember, from
--bin), every link mutual TLS with a throwaway CA. A proxy routes each increment to
its key's primary through the Go router, and a load increments --keys counters at
--rate per second. It first says where everything runs, the assigner's web view on
a line beginning "web:" with the admin's PKCS#12 file to import into a browser
(admin-demo.p12, empty password). Every second it prints the increments sent and
failed, the imbalance and each member's slices and load.

With --roll (or DEMO_ROLL=1), a quarter of the way in, every member is restarted in
turn under the load: it drains on SIGTERM (its primaries demote, its ranges move to
the others make-before-break), stops, and starts again. With --pause (DEMO_PAUSE=1) a
member is stopped (SIGSTOP) for twice its lease (3 s) and then goes on: exclusive, its
primaries move only once its lease ran out, and what it sends when it wakes is refused.

The cluster is exclusive (--exclusive: leases on primary roles, writes fenced by their
tokens) unless --inclusive (DEMO_EXCLUSIVE=0), which shows what a stale primary does:
  DEMO_APP=counter DEMO_EXCLUSIVE=0 DEMO_PAUSE=1 DEMO_SECONDS=30 make demo

It stops after --duration (default: $DEMO_SECONDS seconds, else at Ctrl-C), reads
every count from PostgreSQL and checks them as Jepsen's counter check does, then prints
  final imbalance=X keys=K acked=A stored=S duplicates=D skipped=S2 failed=F
and fails unless duplicates, skipped and failed (but with --pause) are 0 and the table
holds every acknowledged count.`

func command() *cobra.Command {
	cfg := demo.Config{Out: os.Stdout}
	var logLevel string
	cmd := &cobra.Command{
		Use:          "counterdemo",
		Short:        "Run the example counter's demo: members with primaries, under increments",
		Long:         longHelp,
		Example:      "  DEMO_APP=counter make demo\n  DEMO_APP=counter DEMO_ROLL=1 DEMO_SECONDS=40 make demo",
		Args:         cobra.NoArgs,
		SilenceUsage: true, SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := democli.Setup(cmd, logLevel, &cfg.Duration)
			if err != nil {
				return err
			}
			cfg.Log = log
			dir, err := os.MkdirTemp("", "sliceplane-counter-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			cfg.Dir = dir
			if cfg.Bin, err = filepath.Abs(cfg.Bin); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The first Ctrl-C ends the load and starts the check; the second abandons it.
			ended := make(chan struct{})
			cfg.Stop = ended
			checkCtx, abandon := context.WithCancel(context.WithoutCancel(cmd.Context()))
			defer abandon()
			go func() {
				<-ctx.Done()
				close(ended)
				again, stopAgain := signal.NotifyContext(checkCtx, os.Interrupt, syscall.SIGTERM)
				defer stopAgain()
				<-again.Done()
				abandon()
			}()
			s, err := demo.Run(checkCtx, cfg)
			if err != nil {
				return err
			}
			fmt.Println(s)
			return s.Err()
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Bin, "bin", "bin", "directory of the binaries: assigner, slicectl, countermember")
	f.DurationVar(&cfg.Duration, "duration", 0, "stop after this long (default: $DEMO_SECONDS seconds, else at Ctrl-C)")
	f.IntVar(&cfg.Keys, "keys", 100, "number of counters")
	f.Float64Var(&cfg.Rate, "rate", 200, "increments per second")
	f.IntVar(&cfg.Members, "members", 3, "number of members")
	f.DurationVar(&cfg.WriteDelay, "write-delay", 2*time.Millisecond, "added to every increment's write, as a slower database would")
	f.BoolVar(&cfg.Roll, "roll", os.Getenv("DEMO_ROLL") == "1", "restart every member in turn under load (default: $DEMO_ROLL=1)")
	f.BoolVar(&cfg.Pause, "pause", os.Getenv("DEMO_PAUSE") == "1", "pause a member (SIGSTOP) for twice its lease, then SIGCONT (default: $DEMO_PAUSE=1)")
	f.BoolVar(&cfg.Inclusive, "inclusive", os.Getenv("DEMO_EXCLUSIVE") == "0", "run without leases (no --exclusive) and without the fence, to show what breaks (default: $DEMO_EXCLUSIVE=0)")
	f.StringVar(&logLevel, "log-level", "warn", "the demo's own diagnostics: debug, info, warn or error")
	return cmd
}
