package distributor

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/frame"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// puller serves Pull.
type puller struct {
	pb.UnimplementedDistributorServiceServer
	s *Server
}

// sent is a delta sent and not yet acknowledged.
type sent struct {
	to    uint64
	bytes int
}

func (p *puller) Pull(stream pb.DistributorService_PullServer) error {
	s := p.s
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "distributor: a Pull stream must begin with a PullStart")
	}
	id := assignment.NodeID(start.GetNodeId())
	if err := id.Validate(); err != nil {
		return status.Errorf(codes.InvalidArgument, "distributor: %v", err)
	}
	att, err := s.attachNode(ctx, id, start.GetCursor().GetEpoch(), start.GetCursor().GetIndex())
	if err != nil {
		return p.status(err)
	}
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	log := s.log.With("node", id)
	log.Debug("pull", "epoch", att.Epoch, "index", att.Index, "resumed", att.Resumed)

	// Acknowledgements arrive on their own goroutine, which ends with the stream.
	acks := make(chan *pb.Cursor, 64)
	recvDone := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				recvDone <- err
				return
			}
			a := msg.GetAck()
			if a == nil {
				recvDone <- status.Error(codes.InvalidArgument, "distributor: after PullStart, a Pull stream carries only acks")
				return
			}
			select {
			case acks <- a:
			case <-ctx.Done():
				return
			}
		}
	}()

	observeLag := func(d time.Duration) { s.metrics.applyLag.Observe(d.Seconds()) }
	var (
		next     = att.Index
		inFlight []sent
		flight   int // bytes sent and not acknowledged
		clock    uint64
		lastSend time.Time
		slices   = att.Slices
		resumed  = att.Resumed
		tick     = time.NewTicker(s.cfg.ClockInterval)
		onAck    = func(c *pb.Cursor) {
			if c.GetEpoch() != att.Epoch {
				return // of an epoch this stream left
			}
			att.q.ack(c.GetEpoch(), c.GetIndex(), time.Now(), observeLag)
			for len(inFlight) > 0 && inFlight[0].to <= c.GetIndex() {
				flight -= inFlight[0].bytes
				inFlight = inFlight[1:]
			}
		}
	)
	defer tick.Stop()
	for {
		var wake <-chan struct{}
		if flight < s.cfg.MaxInFlightBytes {
			routerClock := s.router.pub.Load()
			ops, c, w, st := att.q.take(att.Stream, att.Epoch, next, s.cfg.MaxDeltaOps, s.cfg.MaxDeltaBytes, routerClock)
			switch st {
			case takeReplaced:
				return status.Errorf(codes.Aborted, "distributor: a newer Pull stream of node %s took over", id)
			case takeGone:
				return status.Errorf(codes.FailedPrecondition, "distributor: node %s is no longer served by %s; ask the assigner where to pull from", id, s.cfg.ID)
			case takeRestart:
				// The node's queue was dropped (it fell too far behind, or the source lost
				// changes): it starts over with a snapshot, after what it was already sent.
				if att, err = s.attachNode(ctx, id, att.Epoch, next); err != nil {
					return p.status(err)
				}
				next, inFlight, flight, slices, resumed = att.Index, nil, 0, att.Slices, att.Resumed
				clock = 0 // until the snapshot is whole, the node's data is no state of the source
				continue
			}
			wake = w
			c = max(c, clock)
			clockOnly := len(ops) == 0 && c > clock && time.Since(lastSend) >= s.cfg.ClockInterval
			// An idle stream carries an empty delta now and then, so that the node tells an
			// idle stream from a stalled link. While the node waits for a snapshot, its epoch
			// is not this one yet: it takes the delta as a heartbeat only.
			heartbeat := len(ops) == 0 && time.Since(lastSend) >= s.cfg.PullHeartbeat
			if len(inFlight) > 0 && len(ops) > 0 && !resumed && !full(ops, s.cfg.MaxDeltaOps, s.cfg.MaxDeltaBytes) {
				// Nagle's rule: while a delta is in flight, a partial one waits for the ack and
				// grows meanwhile. Under load a node gets fewer, fuller deltas (each costs a
				// write, a read and an ack at both ends); when it is idle, nothing waits.
				wake = nil
			} else if len(ops) > 0 || clockOnly || resumed || heartbeat {
				var list *[]keyspace.Range
				if resumed {
					list, resumed = &slices, false
				}
				// A new buffer each time: the transport may still be writing the last one.
				buf := appendDelta(nil, att.Epoch, next, next+uint64(len(ops)), c, ops, list)
				if err := stream.SendMsg(&frame.Frame{Data: buf}); err != nil {
					return err
				}
				s.metrics.deltas.Inc()
				s.metrics.opsSent.Add(float64(len(ops)))
				next += uint64(len(ops))
				clock, lastSend = c, time.Now()
				if len(ops) > 0 {
					inFlight = append(inFlight, sent{to: next, bytes: len(buf)})
					flight += len(buf)
				}
				continue
			}
		}
		select {
		case <-wake: // nil while the window is full: then only acks help
		case a := <-acks:
			onAck(a)
		case <-tick.C:
		case err := <-recvDone:
			if errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// full reports whether ops make a delta worth sending without waiting: they fill half its
// count or bytes.
func full(ops []op, maxOps, maxBytes int) bool {
	if 2*len(ops) >= maxOps {
		return true
	}
	n := 0
	for _, o := range ops {
		n += len(o.data)
	}
	return 2*n >= maxBytes
}

// status maps an error of attaching to a gRPC status.
func (p *puller) status(err error) error {
	switch {
	case errors.Is(err, ErrNotServed):
		return status.Errorf(codes.FailedPrecondition, "%v (by %s); ask the assigner where to pull from", err, p.s.cfg.ID)
	case errors.Is(err, errStopped):
		return status.Error(codes.Unavailable, err.Error())
	}
	return status.FromContextError(err).Err()
}
