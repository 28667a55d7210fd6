package slicectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

type jsonQuantum struct {
	Position   jsonPosition `json:"position"`
	Clock      uint64       `json:"clock"`
	Generation uint64       `json:"generation"`
	Cause      string       `json:"cause"`
	// By is the identity whose call made the quantum; "" for the assigner's own.
	By   string     `json:"by"`
	Time *time.Time `json:"time"`
	// Reinitializing quanta carry the whole map instead of ops; Slices is then its size
	// (absent from the history, which leaves the map out).
	Reinitializing bool     `json:"reinitializing"`
	Slices         *int     `json:"slices,omitempty"`
	Ops            []jsonOp `json:"ops"`
}

func quantumJSON(q *pb.Quantum) jsonQuantum {
	out := jsonQuantum{Position: positionJSON(q.GetPosition()), Clock: q.GetClock(), Generation: q.GetGeneration(),
		Cause: q.GetCause(), By: q.GetBy(), Time: jsonTime(q.GetTime()), Reinitializing: q.GetReinitializing(), Ops: opsJSON(q.GetOps())}
	if a := q.GetAssignment(); a != nil {
		n := len(a.GetStarts())
		out.Slices = &n
	}
	return out
}

// clockOnly reports whether a quantum only advances the clock.
func clockOnly(q *pb.Quantum) bool { return len(q.GetOps()) == 0 && !q.GetReinitializing() }

type quantaOptions struct {
	limit  int
	clock  bool
	follow bool
	ops    bool
}

func newQuantaCommand(g *globalOptions) *cobra.Command {
	o := &quantaOptions{}
	cmd := &cobra.Command{
		Use:   "quanta",
		Short: "List the recent quanta, the changes of the map, and follow new ones",
		Long: `quanta lists the most recent quanta of the leader's term, oldest first. A quantum
is the atomic batch of operations of one balancing pass or one admin change,
stamped with a position (term/seq), the Lamport clock of the data source it
follows, and the generation of the map it leads to; its cause says where it
came from (pass, initial, admin: ..., node: ..., distributors), and BY who made
it: the identity of the certificate whose call made it (plaintext:<address> on
an assigner without TLS), or "-" for the assigner's own. A reinitializing
quantum carries the whole map instead of operations.

Clock-only quanta, which only advance the clock for the distributors, are left
out unless --clock is given; those that record a change without map operations
(a freeze, a drain, a node registered) are always listed (and followed with
--clock). --ops lists each quantum's operations under it.

--follow then prints every new quantum as it is made, until interrupted (Ctrl-C);
it follows a new leader when the old one steps down. --timeout bounds the
listing, not the following. The JSON form is one object per line (JSON Lines),
the YAML form one document per quantum.`,
		Example: `  slicectl quanta
  slicectl quanta --limit 5 --ops
  slicectl quanta --clock --limit 50
  slicectl quanta --follow
  slicectl quanta --follow -o json | jq -c 'select(.cause | startswith("admin"))'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.limit < 0 {
				return usageError(fmt.Errorf("--limit %d: want 0 (the assigner's cap, 100) or more", o.limit))
			}
			var last *pb.Position
			err := g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.ListQuanta(ctx, &pb.ListQuantaRequest{Limit: uint32(o.limit), IncludeClock: o.clock})
				if err != nil {
					return err
				}
				if s.out.table() {
					quantaHeader(s.out.w)
				}
				for _, q := range resp.GetQuanta() {
					if err := o.print(s, q); err != nil {
						return err
					}
					last = q.GetPosition()
				}
				if !o.follow {
					return nil
				}
				return o.followFrom(s, last)
			})
			if o.follow && errors.Is(err, context.Canceled) {
				return nil // the way to stop following
			}
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.limit, "limit", 20, "list at most this many recent quanta; 0 is the assigner's cap, 100")
	f.BoolVar(&o.clock, "clock", false, "include clock-only quanta")
	f.BoolVarP(&o.follow, "follow", "f", false, "then print new quanta as they come, until interrupted")
	f.BoolVar(&o.ops, "ops", false, "list each quantum's operations (table output)")
	return cmd
}

// quantaHeader writes the table's header. The columns have fixed widths, so that quanta
// followed as they come line up with the history.
func quantaHeader(w io.Writer) {
	fmt.Fprintf(w, "%-10s  %10s  %10s  %-23s  %10s  %-31s  %s\n", "POSITION", "CLOCK", "GENERATION", "TIME", "OPS", "BY", "CAUSE")
}

func (o *quantaOptions) print(s *session, q *pb.Quantum) error {
	if !s.out.table() {
		return s.out.line(quantumJSON(q))
	}
	ops := fmt.Sprint(len(q.GetOps()))
	switch {
	case q.GetReinitializing() && q.GetAssignment() != nil:
		ops = fmt.Sprintf("map of %d", len(q.GetAssignment().GetStarts()))
	case q.GetReinitializing():
		ops = "whole map"
	case clockOnly(q):
		ops = "-"
	}
	when := "-"
	if q.GetTime() != nil {
		when = q.GetTime().AsTime().Local().Format("2006-01-02 15:04:05.000")
	}
	by := q.GetBy()
	if by == "" {
		by = "-"
	}
	_, err := fmt.Fprintf(s.out.w, "%-10s  %10d  %10d  %-23s  %10s  %-31s  %s\n", showPosition(q.GetPosition()), q.GetClock(),
		q.GetGeneration(), when, ops, by, q.GetCause())
	if o.ops {
		for _, op := range q.GetOps() {
			fmt.Fprintf(s.out.w, "    %s\n", showOp(op))
		}
	}
	return err
}

// followFrom prints the quanta after position from (nil: the whole map first) until the
// command is interrupted. When the stream ends because its assigner stopped leading, it
// resumes from the last quantum printed on the new leader, which sends the whole map first
// if that position is of an older term.
func (o *quantaOptions) followFrom(s *session, from *pb.Position) error {
	ctx := s.parent
	for {
		err := o.stream(ctx, s, &from)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if st, ok := status.FromError(err); !ok || st.Code() != codes.Unavailable {
			return err
		}
		fmt.Fprintf(s.errOut, "slicectl: the stream of quanta ended (%s); following the new leader\n", status.Convert(err).Message())
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stream prints the quanta of one stream, advancing from.
func (o *quantaOptions) stream(ctx context.Context, s *session, from **pb.Position) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var recv func() (*pb.Quantum, error)
	if o.clock {
		st, err := s.quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{From: *from})
		if err != nil {
			return err
		}
		recv = func() (*pb.Quantum, error) { m, err := skipHeartbeats(st); return m.GetQuantum(), err }
	} else {
		// The assignment watch leaves out clock-only quanta at the source.
		st, err := s.assign.WatchAssignment(ctx, &pb.WatchAssignmentRequest{From: *from})
		if err != nil {
			return err
		}
		recv = func() (*pb.Quantum, error) { m, err := skipHeartbeats(st); return m.GetQuantum(), err }
	}
	for {
		q, err := recv()
		if err != nil {
			return err
		}
		if err := o.print(s, q); err != nil {
			return err
		}
		*from = q.GetPosition()
	}
}

// skipHeartbeats returns the next message of a watch that carries a quantum: an idle stream
// carries heartbeats, which say only that the leader is alive.
func skipHeartbeats[T interface{ GetHeartbeat() bool }](w interface{ Recv() (T, error) }) (T, error) {
	for {
		m, err := w.Recv()
		if err != nil || !m.GetHeartbeat() {
			return m, err
		}
	}
}
