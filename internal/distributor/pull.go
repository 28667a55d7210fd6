package distributor

import (
	"context"
	"errors"
	"math"
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
	s *lane
}

// sent is a delta sent and not yet acknowledged.
type sent struct {
	to    uint64
	bytes int
}

func (p *puller) Pull(stream pb.DistributorService_PullServer) error {
	s := p.s
	ctx := stream.Context()
	id, att, err := p.attach(stream)
	if err != nil {
		return err
	}
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	log := s.log.With("node", id)
	log.Debug("pull", "epoch", att.Epoch, "index", att.Index, "resumed", att.Resumed)

	acks, recvDone := receiveAcks(ctx, stream)
	observeLag := func(d time.Duration) { s.metrics.applyLag.Observe(d.Seconds()) }
	ps := &pullStream{}
	ps.reset(att)
	tick := time.NewTicker(s.cfg.ClockInterval)
	defer tick.Stop()
	for {
		var wake <-chan struct{}
		if ps.flight < s.cfg.MaxInFlightBytes {
			var again bool
			if wake, again, err = p.step(ctx, stream, id, ps); err != nil {
				return err
			}
			if again {
				continue
			}
		}
		select {
		case <-wake: // nil while the window is full: then only acks help
		case a := <-acks:
			ps.ack(a, observeLag)
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

// attach reads the PullStart that must open a stream and attaches its node.
func (p *puller) attach(stream pb.DistributorService_PullServer) (assignment.NodeID, Attached, error) {
	first, err := stream.Recv()
	if err != nil {
		return "", Attached{}, err
	}
	start := first.GetStart()
	if start == nil {
		return "", Attached{}, status.Error(codes.InvalidArgument, "distributor: a Pull stream must begin with a PullStart")
	}
	id := assignment.NodeID(start.GetNodeId())
	if err := id.Validate(); err != nil {
		return "", Attached{}, status.Errorf(codes.InvalidArgument, "distributor: %v", err)
	}
	att, err := p.s.attachNode(stream.Context(), id, start.GetCursor().GetEpoch(), start.GetCursor().GetIndex())
	if err != nil {
		return "", Attached{}, p.status(err)
	}
	return id, att, nil
}

// receiveAcks receives the node's acknowledgements on their own goroutine, which ends with
// the stream (its error on recvDone) or with ctx: the sending loop must not block on them.
func receiveAcks(ctx context.Context, stream pb.DistributorService_PullServer) (acks <-chan *pb.Cursor, recvDone <-chan error) {
	ackc := make(chan *pb.Cursor, 64)
	done := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				done <- err
				return
			}
			a := msg.GetAck()
			if a == nil {
				done <- status.Error(codes.InvalidArgument, "distributor: after PullStart, a Pull stream carries only acks")
				return
			}
			select {
			case ackc <- a:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ackc, done
}

// pullStream is where one Pull stream is: what it sent, and what of that the node has not
// acknowledged yet.
type pullStream struct {
	att      Attached
	next     uint64 // the index of the next op to send
	inFlight []sent
	flight   int // bytes sent and not acknowledged
	clock    uint64
	lastSend time.Time
	slices   []keyspace.Range
	resumed  bool
	gen      uint64 // of the last op sent, or of the op before the stream's start
}

// reset starts the stream over from att, as attached.
func (ps *pullStream) reset(att Attached) {
	ps.att = att
	ps.next, ps.inFlight, ps.flight, ps.slices, ps.resumed, ps.gen = att.Index, nil, 0, att.Slices, att.Resumed, att.Gen
	ps.clock = 0 // until the snapshot is whole, the node's data is no state of the source
}

// ack takes the node's acknowledgement c: the deltas it covers leave the window.
func (ps *pullStream) ack(c *pb.Cursor, observeLag func(time.Duration)) {
	if c.GetEpoch() != ps.att.Epoch {
		return // of an epoch this stream left
	}
	ps.att.q.ack(c.GetEpoch(), c.GetIndex(), time.Now(), observeLag)
	for len(ps.inFlight) > 0 && ps.inFlight[0].to <= c.GetIndex() {
		ps.flight -= ps.inFlight[0].bytes
		ps.inFlight = ps.inFlight[1:]
	}
}

// step takes what the node's queue has for the stream and sends it if it is worth a delta
// now. again says to step once more at once (it sent, or the stream started over); else
// wake, if not nil, is closed when the queue has more.
func (p *puller) step(ctx context.Context, stream pb.DistributorService_PullServer, id assignment.NodeID, ps *pullStream) (wake <-chan struct{}, again bool, err error) {
	s := p.s
	routerClock := s.app.clock.Load()
	ops, c, w, st := ps.att.q.take(ps.att.Stream, ps.att.Epoch, ps.next, s.cfg.MaxDeltaOps, s.cfg.MaxDeltaBytes, routerClock)
	switch st {
	case takeReplaced:
		return nil, false, status.Errorf(codes.Aborted, "distributor: a newer Pull stream of node %s took over", id)
	case takeGone:
		return nil, false, status.Errorf(codes.FailedPrecondition, "distributor: node %s is no longer served by %s; ask the assigner where to pull from", id, s.cfg.ID)
	case takeRestart:
		// The node's queue was dropped (it fell too far behind, or the source lost
		// changes): it starts over with a snapshot, after what it was already sent.
		att, err := s.attachNode(ctx, id, ps.att.Epoch, ps.next)
		if err != nil {
			return nil, false, p.status(err)
		}
		ps.reset(att)
		return nil, true, nil
	}
	c = max(c, ps.clock)
	clockOnly := len(ops) == 0 && c > ps.clock && time.Since(ps.lastSend) >= s.cfg.ClockInterval
	// An idle stream carries an empty delta now and then, so that the node tells an
	// idle stream from a stalled link. While the node waits for a snapshot, its epoch
	// is not this one yet: it takes the delta as a heartbeat only.
	heartbeat := len(ops) == 0 && time.Since(ps.lastSend) >= s.cfg.PullHeartbeat
	if len(ps.inFlight) > 0 && len(ops) > 0 && !ps.resumed && !full(ops, s.cfg.MaxDeltaOps, s.cfg.MaxDeltaBytes) {
		// Nagle's rule: while a delta is in flight, a partial one waits for the ack and
		// grows meanwhile. Under load a node gets fewer, fuller deltas (each costs a
		// write, a read and an ack at both ends); when it is idle, nothing waits.
		return nil, false, nil
	}
	if len(ops) > 0 || clockOnly || ps.resumed || heartbeat {
		return nil, true, p.send(stream, ps, ops, c, routerClock)
	}
	return w, false, nil
}

// send sends ops, the clock c and the router's clock source, as one delta: the node tells
// from source, and from how long ago the distributor last heard from its source, how far
// behind the source it is.
func (p *puller) send(stream pb.DistributorService_PullServer, ps *pullStream, ops []op, c, source uint64) error {
	var list *[]keyspace.Range
	if ps.resumed {
		list, ps.resumed = &ps.slices, false
	}
	// A new buffer each time: the transport may still be writing the last one.
	ps.gen = deltaGen(ops, ps.gen)
	buf := appendDeltaFrom(nil, ps.att.Epoch, ps.next, ps.next+uint64(len(ops)), c, p.s.sourceStamp(source), ps.gen, ops, list)
	if err := stream.SendMsg(&frame.Frame{Data: buf}); err != nil {
		return err
	}
	p.s.metrics.deltas.Inc()
	p.s.metrics.opsSent.Add(float64(len(ops)))
	ps.next += uint64(len(ops))
	ps.clock, ps.lastSend = c, time.Now()
	if len(ops) > 0 {
		ps.inFlight = append(ps.inFlight, sent{to: ps.next, bytes: len(buf)})
		ps.flight += len(buf)
	}
	return nil
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

// sourceStamp is what a delta sent now says of the source, the router's clock being clock.
func (s *lane) sourceStamp(clock uint64) sourceStamp {
	st := sourceStamp{clock: clock}
	if heard := s.sourceHeard.Load(); heard != 0 {
		ms := time.Since(time.Unix(0, heard)).Milliseconds()
		st.silenceMS = uint32(min(max(ms, 0), math.MaxUint32))
	}
	return st
}
