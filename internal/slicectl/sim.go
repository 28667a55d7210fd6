package slicectl

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/sim"
)

type simOptions struct {
	algorithms []string
	params     []string
	workload   string
	trace      string
	keys       int
	nodes      int
	epochs     int
	seed       uint64
	addAt      []int
	removeAt   []string
	zones      int
	removeZone []string
	format     string
	plot       string
	engines    []string
	router     string
	epoch      time.Duration
	halfLife   time.Duration // --half-life, the old name of --load-half-life
	estimator  load.EstimatorFlags
}

// simAlgorithm is an algorithm to simulate: built for the algorithm engine, by name and
// constants for the core, which builds its own.
type simAlgorithm struct {
	alg    balance.Algorithm
	params map[string]string
}

// simLong is sim's help text; the algorithms' constants follow it (paramsHelp).
var simLong = `sim runs one or more balancing algorithms over the same workload, one balancing
pass per epoch, and reports what a system would have experienced.

Engines (--engine, repeatable to compare them in one run):
  core       (default) the assigner's own core on simulated time: each epoch is
             --epoch of time; nodes that join register, nodes that leave
             deregister; at the end of the epoch every node reports the load it
             served per slice and its 16 heaviest keys, the core folds the reports
             with its load estimator and runs its pass. What it shows is what the
             service does. The --load-* flags set the estimator's forecast as they
             do the assigner's (--load-forecast adaptive|ewma|peak|holt, and its
             half-lives); --engine algorithm has no forecast and refuses them.
  algorithm  the algorithm alone, called with each epoch's exact loads, as if the
             assigner knew them: the best the algorithm can do.

Each epoch, the epoch's events apply (loads change, keys and nodes come and go);
the imbalance (max / mean node load) of the assignment in force is measured under
the epoch's loads, a key's load split over its replicas as the router does
(--router); then the pass runs, and its churn is the number of key placements it
adds (a key copied to a node that did not hold it) over the number of keys. On the
core, each node reports the share it served.

Routers (--router), how a slice's load is split over its live replicas:
  least-outstanding  (default) the router's least-outstanding policy, which the
             example proxy, load generator and demos run: requests go to the
             replica with the fewest in flight, so in the fluid limit a slice's
             load fills its holders from the least loaded up to a common level;
             every replicated slice is routed so until no load would move (node
             load taken over capacity). An upper bound on what a router with
             few requests in flight achieves.
  power-of-two  two replicas drawn at random, the less loaded takes the request:
             each pair of a slice's k holders gets 2/(k(k-1)) of its load, poured
             into the pair's valley; with two replicas, least-outstanding.
  even       an even split, as round-robin does (and capacity on equal nodes):
             the simulator's split before routers were modelled.

Columns:
  imbalance       experienced: the map in force under the epoch's actual loads
  reported        what the balancer believed of that map when the epoch began: the
                  core's status imbalance (its estimates); for the algorithm alone,
                  the map under the previous epoch's loads
  forecast err    mean absolute percentage error, over the nodes that served load,
                  of the balancer's forecast of each node's load for the epoch
                  against what the node served (100% at epoch 0: nothing measured)
  churn, slices   as above; the map in force
  orphaned        the share of the key space whose every replica, in the map in
                  force, left at the start of the epoch (--remove-node-at,
                  --remove-zone): keys no node serves until the epoch's pass
  orphaned load   those keys' share of the epoch's load
  key copies      the memory replicas cost: copies of keys the map in force's live
                  replicas hold, over the number of keys (1.000: one replica each)
Zones (--zones N): nodes nI carry the label zone=z(I%N), those that join later
too, and the core balances with zone label "zone" (the algorithm alone is given
each node's zone), spreading a slice's replicas over zones. --remove-zone E:zK
removes every live node of zone zK at the start of epoch E.
Summary: mean forecast err leaves out epoch 0; max orphaned (load) is the
largest orphaned share of an epoch; thrashing is the oscillation score, the mean
over nodes of the trend-discounted total variation (2 x min(rise, fall)) of the
node's load relative to the epoch's mean, per epoch: 0 when loads only converge,
0.2 for a node swinging between 1.0 and 1.2 of the mean every epoch.
undone moves counts, from the maps alone, the slices (or pieces of them) put back
on a node that lost them while live fewer than hold_passes passes before, by any
way: moved back, by way of a third node, or as a replica; "(<4)" shows the window,
the algorithm's hold_passes or Weighted-Move's default. ping-pongs counts moves of
a single-key slice from B back to A after one from A to B, at any time in the
run. split/merge cycles counts the boundaries between slices that a pass removed (a
merge) fewer than 10 passes after a pass made them (a split). All three per epoch in
json and csv (undone_moves, ping_pongs, split_merge_cycles).

Algorithms: ` + strings.Join(balance.Names(), ", ") + `, or all.
Workloads:  ` + sim.Workloads + `
Traces (--trace) are JSON Lines sorted by epoch, one event per line:
  {"epoch":E,"key":"k","load":L}               from epoch E on, key k has load L
  {"epoch":E,"delete_key":"k"}                 key k is deleted
  {"epoch":E,"add_node":"n1","capacity":1.0}   node n1 joins (capacity optional;
                                               "labels":{"zone":"a"} optional, which
                                               it registers with on the core)
  {"epoch":E,"remove_node":"n1"}               node n1 leaves
If a trace adds no node at epoch 0, --nodes nodes n0..n(N-1) exist from the start.`

const simExample = `  # Compare every algorithm on a Zipf workload and draw the result.
  slicectl sim --algorithm all --workload zipf:1.1 --plot out.svg

  # Weighted-Move with a smaller churn budget, 1M keys, a node joining at epoch 5.
  slicectl sim --workload hotspot-shift:1.1:10 --keys 1000000 --nodes 100 \
      --param max_churn=0.05 --add-node-at 5

  # The assigner's core and the algorithm alone, side by side.
  slicectl sim --workload hotspot-shift:1.1:10 --engine core,algorithm

  # Three zones, one of them lost at epoch 10.
  slicectl sim --workload zipf:1.1 --nodes 30 --zones 3 --remove-zone 10:z1

  # Replicas as headroom where the forecast is uncertain, against the old even split.
  slicectl sim --workload noisy --algorithm weighted-move-headroom --router even
  slicectl sim --workload noisy --algorithm weighted-move-headroom --param headroom=0.5

  # Replay a trace and write the per-epoch figures as JSON.
  slicectl sim --trace load.jsonl --algorithm weighted-move --algorithm consistent-hash --format json`

func newSimCommand(g *globalOptions) *cobra.Command {
	o := &simOptions{}
	cmd := &cobra.Command{
		Use:     "sim",
		Short:   "Run balancing algorithms offline against a workload and compare them",
		Long:    simLong,
		Example: simExample,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("output") { // the global -o, which sim honours too
				if cmd.Flags().Changed("format") && o.format != g.output {
					return usageError(fmt.Errorf("--format %q and --output %q: give one or the other", o.format, g.output))
				}
				o.format = g.output
			}
			return o.run(cmd)
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&o.algorithms, "algorithm", "a", []string{"weighted-move"}, "algorithm to run (repeatable, or all)")
	f.StringArrayVarP(&o.params, "param", "p", nil, "algorithm constant as [ALGORITHM:]NAME=VALUE (repeatable); see the algorithm's parameters below")
	f.StringVarP(&o.workload, "workload", "w", "zipf:1.1", "built-in workload: "+sim.Workloads)
	f.StringVar(&o.trace, "trace", "", "JSON Lines trace to replay instead of a built-in workload")
	f.IntVarP(&o.keys, "keys", "k", 100_000, "number of keys of a built-in workload")
	f.IntVarP(&o.nodes, "nodes", "n", 20, "nodes n0..n(N-1) at the start")
	f.IntVarP(&o.epochs, "epochs", "e", 20, "epochs to run (with --trace: default, up to its last event)")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the workload's randomness (and of the random algorithm)")
	f.IntSliceVar(&o.addAt, "add-node-at", nil, "epoch at which a new node joins (repeatable)")
	f.StringArrayVar(&o.removeAt, "remove-node-at", nil, "EPOCH[:NODE] at which a node leaves; default the newest (repeatable)")
	f.IntVar(&o.zones, "zones", 0, "spread nodes nI over zones z0..z(N-1), nI in z(I%N), and balance with zones (0: none)")
	f.StringArrayVar(&o.removeZone, "remove-zone", nil, "EPOCH:ZONE at which every live node of the zone leaves; needs --zones (repeatable)")
	f.StringVar(&o.format, "format", "table", "output format: "+strings.Join(sim.Formats, ", ")+" (the global --output/-o does the same)")
	f.StringVar(&o.plot, "plot", "", "also draw imbalance, churn and forecast error per epoch into this .svg or .png file")
	f.StringArrayVar(&o.engines, "engine", []string{string(sim.EngineCore)}, "what runs the passes: core or algorithm (repeatable, or comma-separated)")
	f.StringVar(&o.router, "router", string(sim.Routers[0]), "how a slice's load splits over its replicas: "+routerNames())
	f.DurationVar(&o.epoch, "epoch", sim.DefaultEpoch, "simulated time of an epoch for the core: the nodes' report window and the pass interval")
	o.estimator.AddFlags(f)
	// --half-life came first; it stays, hidden, for the commands that already use it.
	f.DurationVar(&o.halfLife, "half-life", 0, "the same as --load-half-life")
	_ = f.MarkHidden("half-life")
	cmd.SetHelpTemplate(cmd.HelpTemplate() + paramsHelp())
	return cmd
}

// routerNames lists the routers --router takes, the default first.
func routerNames() string {
	names := make([]string, len(sim.Routers))
	for i, r := range sim.Routers {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// paramsHelp lists every algorithm's constants, for sim --help.
func paramsHelp() string {
	var b strings.Builder
	b.WriteString("\nAlgorithm parameters (--param NAME=VALUE, default in brackets):\n")
	for _, name := range balance.Names() {
		fmt.Fprintf(&b, "  %s: %s\n", name, balance.Help(name))
		ps, _ := balance.Params(name)
		for _, p := range ps {
			fmt.Fprintf(&b, "      %-24s %s [%s]\n", p.Name, p.Help, p.Default)
		}
	}
	return b.String()
}

func (o *simOptions) run(cmd *cobra.Command) error {
	algs, err := o.build()
	if err != nil {
		return usageError(err)
	}
	engines, err := o.parseEngines()
	if err != nil {
		return usageError(err)
	}
	if !slices.Contains(sim.Formats, o.format) {
		return usageError(fmt.Errorf("--format %q: want %s", o.format, strings.Join(sim.Formats, ", ")))
	}
	var plotFormat string
	if o.plot != "" {
		if plotFormat, err = sim.PlotFormat(o.plot); err != nil {
			return usageError(err)
		}
	}
	opt, err := o.options(cmd)
	if err != nil {
		return usageError(err)
	}
	if opt.Estimator, err = o.estimatorConfig(cmd, engines); err != nil {
		return usageError(err)
	}
	sc, title, err := o.scenario(cmd, &opt)
	if err != nil {
		return err
	}

	report, err := o.simulate(cmd, algs, engines, sc, opt)
	if err != nil {
		return err
	}

	if o.plot != "" {
		var img bytes.Buffer
		if err := report.Plot(&img, plotFormat, title); err != nil {
			return err
		}
		if err := os.WriteFile(o.plot, img.Bytes(), 0o644); err != nil {
			return fmt.Errorf("writing the plot: %w", err)
		}
	}
	return report.Write(cmd.OutOrStdout(), o.format)
}

// simulate runs every algorithm on every engine, each on a fresh copy of the work.
func (o *simOptions) simulate(cmd *cobra.Command, algs []simAlgorithm, engines []sim.Engine, sc sim.Scenario,
	opt sim.Options) (sim.Report, error) {
	progress := newProgress(cmd.ErrOrStderr())
	var report sim.Report
	for _, a := range algs {
		for _, engine := range engines {
			label := a.alg.Name() + " (" + string(engine) + ")"
			opt.Progress = func(done, total int) { progress.report(label, done, total) }
			if sc.Workload != nil { // a workload holds per-run state; give every run a fresh one
				var err error
				if sc.Workload, err = sim.ParseWorkload(o.workload, o.keys, opt.Epochs, o.seed); err != nil {
					return report, usageError(err)
				}
			}
			var res sim.Result
			var err error
			if engine == sim.EngineCore {
				res, err = sim.RunCore(cmd.Context(), a.alg.Name(), a.params, sc, opt)
			} else {
				res, err = sim.Run(cmd.Context(), a.alg, sc, opt)
			}
			if err != nil {
				return report, err
			}
			report.Runs = append(report.Runs, res)
		}
	}
	progress.done()
	return report, nil
}

// parseEngines resolves --engine, in the order given.
func (o *simOptions) parseEngines() ([]sim.Engine, error) {
	var out []sim.Engine
	for _, e := range o.engines {
		for _, name := range strings.Split(e, ",") {
			engine := sim.Engine(name)
			if !slices.Contains(sim.Engines, engine) {
				return nil, fmt.Errorf("--engine %q: want core or algorithm", name)
			}
			if !slices.Contains(out, engine) {
				out = append(out, engine)
			}
		}
	}
	return out, nil
}

// build resolves the algorithm names and parameters.
func (o *simOptions) build() ([]simAlgorithm, error) {
	var names []string
	for _, a := range o.algorithms {
		for _, name := range strings.Split(a, ",") {
			switch {
			case name == "all":
				names = append(names, balance.Names()...)
			case !slices.Contains(balance.Names(), name):
				return nil, fmt.Errorf("--algorithm %q: want one of %s, or all", name, strings.Join(balance.Names(), ", "))
			default:
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)

	params := make(map[string]map[string]string, len(names))
	for _, name := range names {
		params[name] = map[string]string{}
	}
	for _, p := range o.params {
		scope, kv, scoped := strings.Cut(p, ":")
		if !scoped || strings.Contains(scope, "=") {
			scope, kv = "", p
		}
		parsed, err := balance.ParseParams([]string{kv})
		if err != nil {
			return nil, fmt.Errorf("--param %q: %w", p, err)
		}
		used := false
		for _, name := range names {
			if scope != "" && scope != name {
				continue
			}
			known, _ := balance.Params(name)
			for k, v := range parsed {
				if slices.ContainsFunc(known, func(q balance.Param) bool { return q.Name == k }) {
					params[name][k], used = v, true
				}
			}
		}
		if !used {
			return nil, fmt.Errorf("--param %q: no selected algorithm has that parameter (see slicectl sim --help)", p)
		}
	}
	algs := make([]simAlgorithm, len(names))
	for i, name := range names {
		if _, set := params[name]["seed"]; !set && name == "random" {
			params[name]["seed"] = strconv.FormatUint(o.seed, 10)
		}
		alg, err := balance.New(name, params[name])
		if err != nil {
			return nil, err
		}
		algs[i] = simAlgorithm{alg: alg, params: params[name]}
	}
	return algs, nil
}

func (o *simOptions) options(cmd *cobra.Command) (sim.Options, error) {
	opt := sim.Options{Nodes: o.nodes, Epochs: o.epochs, AddNodeAt: o.addAt, Epoch: o.epoch}
	var err error
	if opt.Router, err = sim.ParseRouter(o.router); err != nil || o.router == "" {
		return opt, fmt.Errorf("--router %q: want one of %s", o.router, routerNames())
	}
	switch {
	case o.epoch < 100*time.Millisecond:
		return opt, fmt.Errorf("--epoch %s: want at least 100ms, the shortest load report the assigner counts", o.epoch)
	case o.nodes < 1:
		return opt, fmt.Errorf("--nodes %d: want at least 1", o.nodes)
	case cmd.Flags().Changed("epochs") && o.epochs < 1:
		return opt, fmt.Errorf("--epochs %d: want at least 1", o.epochs)
	case o.keys < 1:
		return opt, fmt.Errorf("--keys %d: want at least 1", o.keys)
	case o.trace != "" && cmd.Flags().Changed("workload"):
		return opt, fmt.Errorf("--trace and --workload: give one or the other")
	}
	for _, at := range o.addAt {
		if at < 0 {
			return opt, fmt.Errorf("--add-node-at %d: want an epoch >= 0", at)
		}
	}
	for _, r := range o.removeAt {
		epoch, node, _ := strings.Cut(r, ":")
		e, err := strconv.Atoi(epoch)
		if err != nil || e < 0 {
			return opt, fmt.Errorf("--remove-node-at %q: want EPOCH[:NODE] with EPOCH >= 0", r)
		}
		if node != "" {
			if err := assignment.NodeID(node).Validate(); err != nil {
				return opt, fmt.Errorf("--remove-node-at %q: %w", r, err)
			}
		}
		opt.RemoveNodeAt = append(opt.RemoveNodeAt, sim.Removal{Epoch: e, Node: assignment.NodeID(node)})
	}
	zones, err := o.zoneRemovals(cmd)
	opt.Zones, opt.RemoveZoneAt = o.zones, zones
	return opt, err
}

// estimatorConfig returns the core's estimator from the --load-* flags, the assigner's. They
// shape the core's forecast only: given without the core engine they would change nothing,
// so they are refused rather than silently ignored.
func (o *simOptions) estimatorConfig(cmd *cobra.Command, engines []sim.Engine) (load.EstimatorConfig, error) {
	flags := cmd.Flags()
	if flags.Changed("half-life") {
		if flags.Changed("load-half-life") && o.halfLife != o.estimator.HalfLife {
			return load.EstimatorConfig{}, fmt.Errorf("--half-life %s and --load-half-life %s: give one or the other",
				o.halfLife, o.estimator.HalfLife)
		}
		o.estimator.HalfLife = o.halfLife
	}
	if !slices.Contains(engines, sim.EngineCore) {
		for _, name := range append([]string{"half-life"}, load.EstimatorFlagNames...) {
			if flags.Changed(name) {
				return load.EstimatorConfig{}, fmt.Errorf("--%s shapes the core's load forecast; "+
					"--engine algorithm balances each epoch's exact loads and has none: add --engine core", name)
			}
		}
	}
	cfg, err := o.estimator.Config()
	if o.halfLife < 0 && err != nil {
		return cfg, fmt.Errorf("--half-life %s: want a duration >= 0", o.halfLife)
	}
	return cfg, err
}

// zoneRemovals parses --remove-zone against --zones and --epochs. With a trace and no
// --epochs, the trace sets the number of epochs later, and the simulator checks the epoch.
func (o *simOptions) zoneRemovals(cmd *cobra.Command) ([]sim.ZoneRemoval, error) {
	if o.zones < 0 {
		return nil, fmt.Errorf("--zones %d: want 0 (none) or more", o.zones)
	}
	var out []sim.ZoneRemoval
	for _, r := range o.removeZone {
		epoch, zone, ok := strings.Cut(r, ":")
		e, err := strconv.Atoi(epoch)
		switch {
		case !ok || err != nil || e < 0:
			return nil, fmt.Errorf("--remove-zone %q: want EPOCH:ZONE with EPOCH >= 0", r)
		case o.zones == 0:
			return nil, fmt.Errorf("--remove-zone %q: needs --zones", r)
		case (o.trace == "" || cmd.Flags().Changed("epochs")) && e >= o.epochs:
			return nil, fmt.Errorf("--remove-zone %q: epoch %d is past the last, %d", r, e, o.epochs-1)
		}
		i, err := strconv.Atoi(strings.TrimPrefix(zone, "z"))
		if !strings.HasPrefix(zone, "z") || err != nil || i < 0 || i >= o.zones || sim.ZoneName(i) != zone {
			return nil, fmt.Errorf("--remove-zone %q: zone %q: want one of z0..z%d", r, zone, o.zones-1)
		}
		out = append(out, sim.ZoneRemoval{Epoch: e, Zone: zone})
	}
	return out, nil
}

// scenario loads the trace or parses the workload, and describes it for the plot's title.
func (o *simOptions) scenario(cmd *cobra.Command, opt *sim.Options) (sim.Scenario, string, error) {
	if o.trace == "" {
		wl, err := sim.ParseWorkload(o.workload, o.keys, opt.Epochs, o.seed)
		if err != nil {
			return sim.Scenario{}, "", usageError(err)
		}
		return sim.Scenario{Workload: wl},
			fmt.Sprintf("%s, %d keys, %d nodes, seed %d", o.workload, o.keys, o.nodes, o.seed), nil
	}
	f, err := os.Open(o.trace)
	if err != nil {
		return sim.Scenario{}, "", fmt.Errorf("opening the trace: %w", err)
	}
	defer f.Close()
	initial := make([]assignment.NodeID, o.nodes)
	for i := range initial {
		initial[i] = assignment.NodeID("n" + strconv.Itoa(i))
	}
	tr, err := sim.ReadTrace(f, initial)
	if err != nil {
		return sim.Scenario{}, "", fmt.Errorf("%s: %w", o.trace, err)
	}
	if !cmd.Flags().Changed("epochs") {
		opt.Epochs = max(tr.LastEpoch+1, 1)
	} else if tr.LastEpoch >= opt.Epochs {
		fmt.Fprintf(cmd.ErrOrStderr(), "sim: the trace has events up to epoch %d; running only %d epochs as --epochs says\n",
			tr.LastEpoch, opt.Epochs)
	}
	return sim.Scenario{Trace: tr}, "trace " + o.trace, nil
}

// progress reports on stderr how far a long run has got: nothing for runs that end within a
// couple of seconds, then a line a second.
type progress struct {
	w     io.Writer
	start time.Time
	last  time.Time
	shown bool
}

func newProgress(w io.Writer) *progress { return &progress{w: w, start: time.Now()} }

func (p *progress) report(alg string, done, total int) {
	now := time.Now()
	if now.Sub(p.start) < 2*time.Second || now.Sub(p.last) < time.Second {
		return
	}
	p.last, p.shown = now, true
	fmt.Fprintf(p.w, "sim: %s: epoch %d of %d (%s)\n", alg, done, total, now.Sub(p.start).Round(100*time.Millisecond))
}

func (p *progress) done() {
	if p.shown {
		fmt.Fprintf(p.w, "sim: done in %s\n", time.Since(p.start).Round(100*time.Millisecond))
	}
}
