package slicectl

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// The override commands that change the map or the balancing: move, split, merge, pin,
// unpin, freeze, unfreeze (drain and algorithm have files of their own). Each prints what
// changed, or fails with the assigner's reason for refusing, in which case nothing changed.

// jsonMapChange is what an admin call changed: the quantum it made (its position, the
// generation of the map it led to, its operations), or none when nothing had to change.
type jsonMapChange struct {
	Summary    string       `json:"summary"`
	Position   jsonPosition `json:"position"`
	Generation uint64       `json:"generation"`
	Ops        []jsonOp     `json:"ops"`
}

func mapChangeJSON(c *pb.Change) jsonMapChange {
	return jsonMapChange{Summary: c.GetSummary(), Position: positionJSON(c.GetPosition()), Generation: c.GetGeneration(),
		Ops: opsJSON(c.GetOps())}
}

// printChange prints what an admin call changed.
func printChange(s *session, c *pb.Change) error {
	if !s.out.table() {
		return s.out.print(mapChangeJSON(c))
	}
	w := s.out.w
	fmt.Fprintln(w, c.GetSummary())
	if len(c.GetOps()) == 0 {
		_, err := fmt.Fprintf(w, "  nothing changed: the map stays at generation %d\n", c.GetGeneration())
		return err
	}
	plural := "s"
	if len(c.GetOps()) == 1 {
		plural = ""
	}
	fmt.Fprintf(w, "  quantum %s, generation %d, %d operation%s:\n", showPosition(c.GetPosition()), c.GetGeneration(), len(c.GetOps()), plural)
	for _, op := range c.GetOps() {
		fmt.Fprintf(w, "    %s\n", showOp(op))
	}
	return nil
}

func newMoveCommand(g *globalOptions) *cobra.Command {
	var to []string
	cmd := &cobra.Command{
		Use:   "move SLICE --to NODE[,NODE...]",
		Short: "Give a slice a new replica set",
		Long: `move gives the slice SLICE the replica set --to: one node, or several to
replicate it. The nodes must be registered and not draining. Moving a slice to
the nodes that hold it already changes nothing. Balancing passes remember the
move as one of their own, so that the next pass does not undo it at once; pin
the slice to keep it there for good.

SLICE is the slice's start (0x4000000000000000 or decimal), key:TEXT for the
slice holding a key, or hash:POINT for the slice holding a point.`,
		Example: `  slicectl move 0x4000000000000000 --to n2
  slicectl move key:user:42 --to n2,n3
  slicectl move hash:0x8000000000000001 --to n1 -o json`,
		Args: sliceArgs("SLICE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(to) == 0 {
				return usageError(fmt.Errorf("missing --to: give the node or nodes to hold the slice (usage: %s)", cmd.UseLine()))
			}
			for _, id := range to {
				if strings.TrimSpace(id) == "" {
					return usageError(fmt.Errorf("--to %q: a node ID is empty", strings.Join(to, ",")))
				}
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Move(ctx, &pb.MoveRequest{Slice: mustSliceRef(args[0]), To: to})
				if err != nil {
					return err
				}
				return printChange(s, resp.GetChange())
			})
		},
	}
	cmd.Flags().StringSliceVar(&to, "to", nil, "the nodes to hold the slice, comma-separated (or repeated)")
	_ = cmd.RegisterFlagCompletionFunc("to", g.completeNodes)
	return cmd
}

func newSplitCommand(g *globalOptions) *cobra.Command {
	var atKey, atHash string
	cmd := &cobra.Command{
		Use:   "split [SLICE] [--at KEY | --at-hash POINT]",
		Short: "Cut a slice in two, at its middle or at a key or point",
		Long: `split cuts the slice SLICE in two: at its middle, or where --at KEY (the key's
hash) or --at-hash POINT says. Both halves keep its replica set. The point must
lie strictly inside the slice; a slice of a single point cannot be split.

Without SLICE, --at KEY (or --at-hash) splits the slice holding that key (or
point) there, which gives the key's hash a slice starting at it, such as one to
move a hot key apart.`,
		Example: `  # Halve a slice.
  slicectl split 0x4000000000000000

  # Cut the slice holding user:42 where user:42 hashes to.
  slicectl split --at user:42

  # Cut a slice at a given point.
  slicectl split 0x4000000000000000 --at-hash 0x4800000000000000`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return positional("SLICE")(0)(cmd, args)
			}
			return sliceArgs("SLICE")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := splitRequest(cmd, args, atKey, atHash)
			if err != nil {
				return err
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Split(ctx, req)
				if err != nil {
					return err
				}
				return printChange(s, resp.GetChange())
			})
		},
	}
	cmd.Flags().StringVar(&atKey, "at", "", "split where this key hashes to")
	cmd.Flags().StringVar(&atHash, "at-hash", "", "split at this point (0x-prefixed hex or decimal)")
	return cmd
}

// splitRequest builds the request of split from its arguments and --at or --at-hash, which
// cobra has parsed into atKey and atHash.
func splitRequest(cmd *cobra.Command, args []string, atKey, atHash string) (*pb.SplitRequest, error) {
	req := &pb.SplitRequest{}
	switch {
	case cmd.Flags().Changed("at") && cmd.Flags().Changed("at-hash"):
		return nil, usageError(errors.New("--at and --at-hash: give one or the other"))
	case cmd.Flags().Changed("at"):
		if atKey == "" {
			return nil, usageError(errors.New("--at is empty: give a key"))
		}
		req.At = &pb.SplitRequest_AtKey{AtKey: []byte(atKey)}
	case cmd.Flags().Changed("at-hash"):
		p, err := keyspace.ParsePoint(atHash)
		if err != nil {
			return nil, usageError(fmt.Errorf("--at-hash: %w", err))
		}
		req.At = &pb.SplitRequest_AtHash{AtHash: p}
	case len(args) == 0:
		return nil, usageError(fmt.Errorf("missing SLICE: give the slice to split, or --at KEY (usage: %s)", cmd.UseLine()))
	}
	if len(args) == 1 {
		req.Slice = mustSliceRef(args[0])
	}
	return req, nil
}

func newMergeCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "merge LEFT RIGHT",
		Short: "Join two adjacent slices",
		Long: `merge joins the slice LEFT with the slice RIGHT that follows it into one slice,
held by LEFT's replica set (RIGHT's keys move to it first if their replica sets
differ). Both are SLICE arguments: a start, key:TEXT or hash:POINT. The slices
must be adjacent, LEFT first.`,
		Example: `  slicectl merge 0x4000000000000000 0x4100000000000000
  slicectl merge key:user:1 key:user:2`,
		Args: sliceArgs("LEFT", "RIGHT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Merge(ctx, &pb.MergeRequest{Left: mustSliceRef(args[0]), Right: mustSliceRef(args[1])})
				if err != nil {
					return err
				}
				return printChange(s, resp.GetChange())
			})
		},
	}
}

// jsonPin is what pin and unpin changed.
type jsonPin struct {
	Summary string    `json:"summary"`
	Range   jsonRange `json:"range"`
	Pinned  bool      `json:"pinned"`
	// Changed is false when the slice already was as asked (pinned, or not pinned): pin and
	// unpin are both idempotent.
	Changed bool `json:"changed"`
}

func newPinCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "pin SLICE",
		Short: "Keep a slice where it is: balancing passes leave it alone",
		Long: `pin keeps the range of the slice SLICE where it is: balancing passes never move,
split or merge it, and its replica set stays as it is. Overrides (move, split,
merge) still apply to it. status lists the pinned ranges; unpin releases one.
Pinning a pinned slice succeeds, says so, and changes nothing.`,
		Example: `  slicectl pin 0x4000000000000000
  slicectl pin key:user:42`,
		Args: sliceArgs("SLICE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Pin(ctx, &pb.PinRequest{Slice: mustSliceRef(args[0])})
				if err != nil {
					return err
				}
				r := resp.GetPinned()
				out := jsonPin{Summary: "pin " + showRange(r), Range: rangeJSON(r), Pinned: true, Changed: !resp.GetAlready()}
				line := fmt.Sprintf("pinned %s: balancing passes leave it where it is", showRange(r))
				if resp.GetAlready() {
					out.Summary = showRange(r) + " is already pinned"
					line = out.Summary + ": nothing changed"
				}
				if !s.out.table() {
					return s.out.print(out)
				}
				_, err = fmt.Fprintln(s.out.w, line)
				return err
			})
		},
	}
}

func newUnpinCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "unpin SLICE",
		Short: "Let balancing passes move a pinned slice again",
		Long: `unpin removes the pins that overlap the slice SLICE, so that balancing passes
may move, split and merge it again. Like pin, it is idempotent: unpinning a
slice that is not pinned succeeds, says so, and changes nothing.`,
		Example: `  slicectl unpin 0x4000000000000000
  slicectl unpin key:user:42`,
		Args: sliceArgs("SLICE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Unpin(ctx, &pb.UnpinRequest{Slice: mustSliceRef(args[0])})
				if err != nil {
					return err
				}
				r := resp.GetUnpinned()
				out := jsonPin{Summary: "unpin " + showRange(r), Range: rangeJSON(r), Pinned: false, Changed: !resp.GetAlready()}
				line := fmt.Sprintf("unpinned %s: balancing passes may move it again", showRange(r))
				if resp.GetAlready() {
					out.Summary = showRange(r) + " is not pinned"
					line = out.Summary + ": nothing changed"
				}
				if !s.out.table() {
					return s.out.print(out)
				}
				_, err = fmt.Fprintln(s.out.w, line)
				return err
			})
		},
	}
}

// jsonFreeze is what freeze and unfreeze changed.
type jsonFreeze struct {
	Summary   string `json:"summary"`
	Frozen    bool   `json:"frozen"`
	WasFrozen bool   `json:"was_frozen"`
	Reason    string `json:"reason,omitempty"`
}

func newFreezeCommand(g *globalOptions) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "freeze [--reason TEXT]",
		Short: "Stop balancing passes",
		Long: `freeze stops balancing passes: the map stays as it is, apart from overrides,
clock quanta and the first map, which go on. A drain makes no progress while
balancing is frozen, as passes move the slices off a draining node. The reason
goes into the assigner's log. unfreeze resumes balancing.`,
		Example: `  slicectl freeze --reason "incident 4711: investigating hot shard"
  slicectl unfreeze`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				return setFrozen(ctx, s, true, reason)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why balancing is frozen, for the assigner's log")
	return cmd
}

func newUnfreezeCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "unfreeze",
		Short: "Resume balancing passes",
		Long:  `unfreeze resumes the balancing passes that freeze stopped.`,
		Example: `  slicectl unfreeze
  slicectl unfreeze -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				return setFrozen(ctx, s, false, "")
			})
		},
	}
}

// setFrozen freezes or unfreezes balancing and says what changed.
func setFrozen(ctx context.Context, s *session, frozen bool, reason string) error {
	before, err := s.admin.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return err
	}
	if frozen {
		_, err = s.admin.Freeze(ctx, &pb.FreezeRequest{Reason: reason})
	} else {
		_, err = s.admin.Unfreeze(ctx, &pb.UnfreezeRequest{})
	}
	if err != nil {
		return err
	}
	out := jsonFreeze{Frozen: frozen, WasFrozen: before.GetFrozen(), Reason: reason}
	switch {
	case frozen && reason != "":
		out.Summary = fmt.Sprintf("balancing frozen: %s", reason)
	case frozen:
		out.Summary = "balancing frozen"
	default:
		out.Summary = "balancing resumed"
	}
	if out.WasFrozen == frozen {
		out.Summary += fmt.Sprintf(" (it was %s already)", map[bool]string{true: "frozen", false: "running"}[frozen])
	}
	if !s.out.table() {
		return s.out.print(out)
	}
	_, err = fmt.Fprintln(s.out.w, out.Summary)
	return err
}
