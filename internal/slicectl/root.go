// Package slicectl holds the commands of the slicectl binary, one file per command group.
package slicectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/cli"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/target"
)

// ErrUsage is wrapped by errors about how a command was called (bad flags or arguments):
// cli.ErrUsage, which main reports with exit status 2.
var ErrUsage = cli.ErrUsage

// Command groups, for the root's help.
const (
	groupInspect  = "inspect"
	groupOverride = "override"
	groupOffline  = "offline"
	groupSecurity = "security"
)

// globalOptions are the root's persistent flags, which every command takes.
type globalOptions struct {
	// assigners are the addresses of the assigners: the leader and its standbys, in any order.
	assigners []string
	// target is the target (sharded service) the command acts on; "" the default one.
	target string
	output string
	// timeout bounds a whole command, connecting included (drain's wait and quanta --follow
	// aside, which have their own limits).
	timeout time.Duration
	// tls is --tls-cert, --tls-key and --tls-ca; tlsSource its files once loaded (nil:
	// plaintext).
	tls       mtls.Config
	tlsSource *mtls.Source
	tlsLoaded bool
}

// defaultAssigner is where `assigner` serves with no flags.
const defaultAssigner = "127.0.0.1:7070"

// NewRootCommand returns the slicectl command tree. Output goes to out, diagnostics and
// progress to errOut.
func NewRootCommand(out, errOut io.Writer) *cobra.Command {
	g := &globalOptions{}
	root := &cobra.Command{
		Use:   "slicectl",
		Short: "Inspect, steer and simulate Sliceplane",
		Long: `slicectl is the command-line tool of Sliceplane, an auto-sharding control plane
that keeps the keys of a stateful service balanced across its storage nodes.

It talks to a running assigner (--assigner; give every assigner's address and
slicectl follows the leader) to inspect the assignment (status, nodes, slices,
lookup, quanta, explain) and to override it (move, split, merge, pin, unpin,
drain, freeze, unfreeze, algorithm). Every override is applied as one quantum,
and printed with its operations, or refused with the assigner's reason, in which
case nothing changed.

It also runs the offline simulator, which compares balancing algorithms on the
same workload, and its data commands read and write the items of the built-in
etcd backend as a backend change tracker would.

Against a cluster with mutual TLS, give slicectl its certificate with --tls-cert,
--tls-key and --tls-ca, or once for a shell with SLICEPLANE_TLS_CERT,
SLICEPLANE_TLS_KEY and SLICEPLANE_TLS_CA (a flag given wins). Its identity decides
what it may do: a viewer inspects, an admin overrides too. slicectl certs init
makes a development CA and the certificates of a cluster.

A SLICE argument names a slice in one of three ways:
  0x4000000000000000   the slice starting at this point (hex as printed, or decimal)
  key:TEXT             the slice holding key TEXT (its xxhash64)
  hash:0x1234...       the slice holding this point of the hash space

Output is a table by default, or JSON or YAML (--output), with stable field
names; points of the hash space are written as 0x and 16 hex digits. An
assigner that cannot be reached is reported once --timeout runs out. Exit
status: 0 done, 1 failed or refused, 2 bad usage, 130 interrupted.`,
		Example: `  # What the assigner is doing, and where a key lives.
  slicectl status
  slicectl lookup user:42

  # Against a cluster of three assigners, as JSON.
  slicectl --assigner 10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070 nodes -o json

  # Empty a node before maintenance, then let it take slices again.
  slicectl drain n3
  slicectl drain n3 --cancel

  # The targets (sharded services) of the control plane, and one target's nodes.
  slicectl targets
  slicectl --target kv nodes

  # Against a cluster with mutual TLS, as its admin.
  export SLICEPLANE_TLS_CERT=certs/admin-alice.crt SLICEPLANE_TLS_KEY=certs/admin-alice.key SLICEPLANE_TLS_CA=certs/ca.crt
  slicectl status

  # Shell completion (bash; see slicectl completion --help for the others).
  source <(slicectl completion bash)`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.SetErr(errOut)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })

	f := root.PersistentFlags()
	f.StringSliceVar(&g.assigners, "assigner", []string{defaultAssigner},
		"assigner addresses, comma-separated: the leader and its standbys (slicectl follows the leader)")
	f.StringVar(&g.target, "target", "", "the target (sharded service) to act on: slicectl targets lists them (default: the default target)")
	f.StringVarP(&g.output, "output", "o", "table", "output format: table, json or yaml")
	f.DurationVar(&g.timeout, "timeout", 10*time.Second, "time limit of the whole command, connecting included")
	g.addTLSFlags(f)
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputs, cobra.ShellCompDirectiveNoFileComp))
	_ = root.RegisterFlagCompletionFunc("assigner", cobra.NoFileCompletions)

	addCommands(root, g)
	initDefaultCommands(root)
	return root
}

// addCommands adds every command to root, in its group of the root's help.
func addCommands(root *cobra.Command, g *globalOptions) {
	root.AddGroup(
		&cobra.Group{ID: groupInspect, Title: "Inspect a running assigner:"},
		&cobra.Group{ID: groupOverride, Title: "Override the assignment:"},
		&cobra.Group{ID: groupOffline, Title: "Data and simulation:"},
		&cobra.Group{ID: groupSecurity, Title: "Security:"},
	)
	for _, c := range []*cobra.Command{
		newStatusCommand(g), newNodesCommand(g), newSlicesCommand(g), newLookupCommand(g),
		newQuantaCommand(g), newExplainCommand(g), newTargetsCommand(g),
	} {
		c.GroupID = groupInspect
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{
		newMoveCommand(g), newSplitCommand(g), newMergeCommand(g), newPinCommand(g), newUnpinCommand(g), newUnquarantineCommand(g),
		newDrainCommand(g), newFreezeCommand(g), newUnfreezeCommand(g), newAlgorithmCommand(g),
	} {
		c.GroupID = groupOverride
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{newSimCommand(g), newDataCommand(g), newPGCommand(g)} {
		c.GroupID = groupOffline
		root.AddCommand(c)
	}
	certs := newCertsCommand(g)
	certs.GroupID = groupSecurity
	root.AddCommand(certs)
}

// initDefaultCommands adds cobra's help and completion commands now rather than at Execute,
// to give them examples like every other command.
func initDefaultCommands(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Example = "  slicectl help move\n  slicectl move --help"
		case "completion":
			c.Example = `  # Load completion into the current bash, or install it for every new shell.
  source <(slicectl completion bash)
  slicectl completion bash > /etc/bash_completion.d/slicectl

  # zsh and fish.
  slicectl completion zsh > "${fpath[1]}/_slicectl"
  slicectl completion fish > ~/.config/fish/completions/slicectl.fish`
			for _, sh := range c.Commands() {
				sh.Example = "  slicectl completion " + sh.Name()
			}
		}
	}
}

// Execute runs the command tree with args and classifies cobra's own complaints about unknown
// commands as usage errors (cobra has no error type for them).
func Execute(ctx context.Context, args []string, out, errOut io.Writer) error {
	root := NewRootCommand(out, errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err != nil && !errors.Is(err, ErrUsage) && strings.HasPrefix(err.Error(), "unknown command") {
		return usageError(err)
	}
	return err
}

// outputs are the formats of --output for the commands that talk to an assigner.
var outputs = []string{"table", "json", "yaml"}

// check validates the global flags for a command that accepts the formats allowed.
func (g *globalOptions) check(allowed []string) error {
	switch {
	case !slices.Contains(allowed, g.output):
		return fmt.Errorf("--output %q: want %s", g.output, orList(allowed))
	case g.timeout <= 0:
		return fmt.Errorf("--timeout %s: want a positive duration", g.timeout)
	}
	if err := target.CheckRef(g.target); err != nil {
		return fmt.Errorf("--target: %w", err)
	}
	return nil
}

// checkAssigners validates --assigner.
func (g *globalOptions) checkAssigners() error {
	if len(g.assigners) == 0 {
		return errors.New("--assigner is empty: give at least one address")
	}
	for _, a := range g.assigners {
		if strings.TrimSpace(a) == "" {
			return fmt.Errorf("--assigner %q: an address is empty", strings.Join(g.assigners, ","))
		}
	}
	return nil
}

// orList writes "a, b or c".
func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// noArgs is cobra.NoArgs, reporting extra arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.NoArgs(cmd, args); err != nil {
		return usageError(err)
	}
	return nil
}

// helpOrUnknown is the RunE of a command that only groups others: alone it shows its help,
// and an argument is an unknown subcommand (cobra would otherwise print the help and succeed).
func helpOrUnknown(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError(fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath()))
	}
	return cmd.Help()
}

type usage struct{ error }

func (u usage) Unwrap() []error { return []error{u.error, ErrUsage} }

func usageError(err error) error { return usage{err} }
