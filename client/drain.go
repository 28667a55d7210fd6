package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/dial"
)

// drainPoll is how often Drain looks whether the node still holds a slice, by the map and
// by its own deltas; a poll keeps Drain out of the pull loop's way.
const drainPoll = 100 * time.Millisecond

// Drain leaves gracefully, make-before-break: it asks the assigner to move the node's
// slices away, waits while the node keeps serving them and applying their deltas until it
// holds none (each slice handed off to a replica that has loaded it, and the old holder's
// linger over), then deregisters. Run must keep running until Drain returns: it is Run that
// serves and drops the slices; cancel Run's context afterwards. If ctx ends first, Drain
// returns ctx's error and the node is still registered, and draining: it may just go, its
// slices moving when its lease lapses, or call Leave. The assigner refuses to drain the
// last node, and ends a drain when every node is draining (FAILED_PRECONDITION, as when a
// whole cluster stops): then Drain returns that error at once.
func (n *Node) Drain(ctx context.Context) error {
	conn, err := dial.Leader(n.cfg.Assigners, n.tls.DialOption("assigner"))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer conn.Close()
	nodes := pb.NewNodeServiceClient(conn)
	n.log.Info("draining: the node serves its slices until each is handed off", "slices", len(n.Slices()))
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	// Both must say the node holds nothing: its own view alone would end a drain at once
	// when the deltas giving it slices the map already holds on it have not arrived yet,
	// and the map's alone would end it before the node applied its drops. Asking again
	// also learns when the drain cannot go on (every node is draining).
	for {
		held, err := n.askDrain(ctx, nodes)
		if err != nil {
			return err
		}
		if held == 0 && len(n.Slices()) == 0 {
			break
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("client: draining %s: %d slices left: %w", n.cfg.ID, max(held, len(n.Slices())), ctx.Err())
		}
	}
	if _, err := nodes.Deregister(ctx, &pb.DeregisterRequest{NodeId: n.cfg.ID}, grpc.WaitForReady(true)); err != nil {
		return fmt.Errorf("client: deregistering %s: %w", n.cfg.ID, err)
	}
	n.log.Info("drained: the node holds no slice and left")
	return nil
}

// askDrain asks the assigner to drain the node, again while no leader answers (a node that
// drains as the assigners roll too), and returns how many slices the map still holds on
// it. Asking a draining node again changes nothing.
func (n *Node) askDrain(ctx context.Context, nodes pb.NodeServiceClient) (int, error) {
	b := newBackoff()
	for {
		resp, err := nodes.Drain(ctx, &pb.NodeServiceDrainRequest{NodeId: n.cfg.ID}, grpc.WaitForReady(true))
		switch status.Code(err) {
		case codes.OK:
			return int(resp.GetSlices()), nil
		case codes.Unavailable, codes.DeadlineExceeded, codes.NotFound:
			// No leader, or one that has not heard of the node yet: its session registers it.
			if ctx.Err() == nil {
				sleep(ctx, b.NextBackOff())
				continue
			}
		}
		return 0, fmt.Errorf("client: draining %s: %w", n.cfg.ID, err)
	}
}

// LeaveFor tells the assigner that the node restarts within grace with its store intact
// (maintenance): rather than move its slices away and back, the assigner keeps them where
// they are, the node's lease lasting grace (capped by the assigner), and the restarted node
// resumes from the cursor in its store. Its slices have no serving replica meanwhile, unless
// they have others: prefer Drain when reads must not fail. Call it after Run returned.
func (n *Node) LeaveFor(ctx context.Context, grace time.Duration) error {
	if grace <= 0 {
		return fmt.Errorf("client: grace %s: want > 0 (Leave leaves for good)", grace)
	}
	conn, err := dial.Leader(n.cfg.Assigners, n.tls.DialOption("assigner"))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer conn.Close()
	req := &pb.DeregisterRequest{NodeId: n.cfg.ID, Grace: durationpb.New(grace)}
	if _, err := pb.NewNodeServiceClient(conn).Deregister(ctx, req, grpc.WaitForReady(true)); err != nil {
		return fmt.Errorf("client: leaving %s for %s: %w", n.cfg.ID, grace, err)
	}
	return nil
}
