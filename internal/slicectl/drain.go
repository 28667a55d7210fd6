package slicectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// jsonDrain is the outcome of drain.
type jsonDrain struct {
	Node     string `json:"node"`
	Draining bool   `json:"draining"`
	// Slices is how many slices the node holds: when the drain began, with --no-wait or
	// --cancel; at the end of the wait, otherwise (0 once drained).
	Slices uint32 `json:"slices"`
	// Drained says the node holds nothing and may leave; Left that it left the cluster
	// while the command waited.
	Drained bool    `json:"drained"`
	Left    bool    `json:"left,omitempty"`
	Waited  float64 `json:"waited_seconds"`
}

type drainOptions struct {
	noWait      bool
	cancel      bool
	waitTimeout time.Duration
	interval    time.Duration
	failing     string // why passes fail, as last said; "" while they succeed
}

func newDrainCommand(g *globalOptions) *cobra.Command {
	o := &drainOptions{}
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Move every slice off a node, and wait until it holds none",
		Long: `drain marks node NODE as draining: it takes no new slices, and balancing passes
move its slices to the other nodes (clean-up runs first in every pass and is
not limited by the churn budget). The node learns it is draining from its
heartbeats and may leave once it holds nothing. Draining a node that is already
draining changes nothing; the assigner refuses to drain the last node that
could hold the slices.

drain then waits until the node holds no slice, showing progress on stderr, up
to --wait-timeout (--timeout bounds each call to the assigner, not the wait).
--no-wait returns at once. --cancel stops a drain: the node may take slices
again (balancing moves them back only as load calls for it).

While balancing is frozen, or while balancing passes fail, a drain makes no
progress; drain says so, with the reason the passes fail.`,
		Example: `  # Empty n3 before maintenance, waiting for it.
  slicectl drain n3

  # Start draining and return; watch it with slicectl nodes.
  slicectl drain n3 --no-wait

  # Changed your mind.
  slicectl drain n3 --cancel`,
		Args:              positional("NODE")(1),
		ValidArgsFunction: g.nodeArgCompletion,
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			switch {
			case strings.TrimSpace(node) == "":
				return usageError(errors.New("NODE is empty"))
			case o.waitTimeout < 0:
				return usageError(fmt.Errorf("--wait-timeout %s: want 0 (no limit) or a positive duration", o.waitTimeout))
			case o.interval <= 0:
				return usageError(fmt.Errorf("--poll-interval %s: want a positive duration", o.interval))
			case o.cancel && (o.noWait || cmd.Flags().Changed("wait-timeout")):
				return usageError(errors.New("--cancel does not wait: leave out --no-wait and --wait-timeout"))
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				return o.run(ctx, s, node)
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.noWait, "no-wait", false, "start the drain and return at once")
	f.BoolVar(&o.cancel, "cancel", false, "stop draining the node")
	f.DurationVar(&o.waitTimeout, "wait-timeout", 30*time.Minute, "how long to wait for the node to hold nothing; 0 is no limit")
	f.DurationVar(&o.interval, "poll-interval", 250*time.Millisecond, "how often to ask the assigner how far the drain got")
	_ = f.MarkHidden("poll-interval")
	return cmd
}

func (o *drainOptions) run(ctx context.Context, s *session, node string) error {
	resp, err := s.admin.Drain(ctx, &pb.DrainRequest{NodeId: node, Cancel: o.cancel})
	if err != nil {
		return err
	}
	held := resp.GetSlices()
	out := jsonDrain{Node: node, Draining: !o.cancel, Slices: held}
	switch {
	case o.cancel:
		return o.report(s, out, fmt.Sprintf("stopped draining %s: it holds %d slices and may take more", node, held))
	case o.noWait:
		return o.report(s, out, fmt.Sprintf("draining %s: it holds %d slices, which balancing passes move off", node, held))
	}
	if held == 0 {
		out.Drained = true
		return o.report(s, out, fmt.Sprintf("%s is drained: it holds no slice and may leave", node))
	}
	st, err := s.admin.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return err
	}
	if st.GetFrozen() {
		fmt.Fprintf(s.errOut, "slicectl: balancing is frozen: the drain of %s makes no progress until slicectl unfreeze\n", node)
	}
	o.warnFailing(s, node, st)
	start := time.Now()
	out, err = o.wait(s, node, held)
	out.Waited = time.Since(start).Seconds()
	if err != nil {
		return err
	}
	line := fmt.Sprintf("%s is drained: it holds no slice and may leave (waited %s)", node, time.Since(start).Round(time.Millisecond))
	if out.Left {
		line = fmt.Sprintf("%s left the cluster while draining (waited %s)", node, time.Since(start).Round(time.Millisecond))
	}
	return o.report(s, out, line)
}

func (o *drainOptions) report(s *session, out jsonDrain, line string) error {
	if !s.out.table() {
		return s.out.print(out)
	}
	_, err := fmt.Fprintln(s.out.w, line)
	return err
}

// wait polls the node until it holds no slice (or leaves), within --wait-timeout; each poll
// is bounded by --timeout, and a poll that fails (a failover, say) is retried.
func (o *drainOptions) wait(s *session, node string, held uint32) (jsonDrain, error) {
	out := jsonDrain{Node: node, Draining: true, Slices: held}
	ctx := s.parent
	if o.waitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.waitTimeout)
		defer cancel()
	}
	bar := newDrainProgress(s.errOut, node, held)
	defer bar.finish()
	var lastErr error
	for {
		n, found, err := o.holds(ctx, s, node)
		switch {
		case err != nil:
			lastErr = err
		case !found:
			out.Slices, out.Drained, out.Left = 0, true, true
			bar.set(0)
			return out, nil
		default:
			lastErr = nil
			out.Slices = n
			bar.set(n)
			if n == 0 {
				out.Drained = true
				return out, nil
			}
			o.checkPasses(ctx, s, node)
		}
		select {
		case <-time.After(o.interval):
		case <-ctx.Done():
			if s.parent.Err() != nil {
				return out, s.parent.Err()
			}
			msg := fmt.Sprintf("%s still holds %d slices after --wait-timeout %s; the drain goes on (slicectl nodes shows it)",
				node, out.Slices, o.waitTimeout)
			if lastErr != nil {
				msg += fmt.Sprintf("; the last poll failed: %v", s.g.explain(s.parent, lastErr))
			}
			if o.failing != "" {
				msg += "; balancing passes are failing: " + o.failing
			}
			return out, errors.New(msg)
		}
	}
}

// warnFailing says, once per cause, that balancing passes are failing, since then a drain
// makes no progress: only the clean-up of departed nodes runs, not the moves a drain needs.
func (o *drainOptions) warnFailing(s *session, node string, st *pb.StatusResponse) {
	if st.GetPassFailures() == 0 {
		o.failing = ""
		return
	}
	if st.GetPassError() == o.failing {
		return
	}
	o.failing = st.GetPassError()
	fmt.Fprintf(s.errOut, "slicectl: balancing passes are failing (%d in a row): the drain of %s makes no progress until they succeed: %s\n",
		st.GetPassFailures(), node, o.failing)
}

// checkPasses asks whether passes fail, within --timeout, and says so if they do; a failed
// poll is left to the next one.
func (o *drainOptions) checkPasses(ctx context.Context, s *session, node string) {
	ctx, cancel := context.WithTimeout(ctx, s.g.timeout)
	defer cancel()
	if st, err := s.admin.Status(ctx, &pb.StatusRequest{}); err == nil {
		o.warnFailing(s, node, st)
	}
}

// holds returns how many slices node holds, and false if it is no longer registered.
func (o *drainOptions) holds(ctx context.Context, s *session, node string) (uint32, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.g.timeout)
	defer cancel()
	resp, err := s.admin.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		return 0, false, err
	}
	for _, n := range resp.GetNodes() {
		if n.GetNode().GetId() == node {
			return n.GetSlices(), true, nil
		}
	}
	return 0, false, nil
}

// drainProgress shows how many of a node's slices have moved off: a bar on a terminal, a
// line per change otherwise (a log keeps every line a bar would redraw).
type drainProgress struct {
	w     io.Writer
	node  string
	total uint32
	last  uint32
	bar   *progressbar.ProgressBar
}

func newDrainProgress(w io.Writer, node string, total uint32) *drainProgress {
	p := &drainProgress{w: w, node: node, total: total, last: total}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(int(total),
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("draining "+node),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("slices"),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetRenderBlankState(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
		)
		return p
	}
	fmt.Fprintf(w, "draining %s: %d slices to move\n", node, total)
	return p
}

// set records that the node holds n slices.
func (p *drainProgress) set(n uint32) {
	if n == p.last {
		return
	}
	p.last = n
	if p.bar != nil {
		_ = p.bar.Set(int(p.total - min(n, p.total)))
		return
	}
	fmt.Fprintf(p.w, "draining %s: %d of %d slices moved, %d left\n", p.node, p.total-min(n, p.total), p.total, n)
}

func (p *drainProgress) finish() {
	if p.bar != nil && !p.bar.IsFinished() {
		_ = p.bar.Exit()
		fmt.Fprintln(p.w)
	}
}
