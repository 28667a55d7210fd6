// Package mapserve serves the assignment from a hub over gRPC: the assignment watch, the
// quanta watch, the whole map and lookups. The assigner serves the hub it publishes to, and a
// relay the copy it keeps of the assigner's stream, with this one implementation, so that a
// watcher sees the same protocol, heartbeats and resumption whichever of them it watches.
package mapserve

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/frame"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// MaxLookupKey bounds the key of a Lookup.
const MaxLookupKey = 64 << 10

// Feed is a hub with the encodings of its quanta: each quantum is encoded once, as it is
// published, and every watcher sends the same bytes (for a hundred watchers, encoding per
// watcher would cost a hundred times the encoding).
type Feed struct {
	hub     *quantum.Hub
	encoded encodings
	reinits reinitCache
}

// NewFeed returns the feed of hub h.
func NewFeed(h *quantum.Hub) *Feed { return &Feed{hub: h} }

// Hub returns the feed's hub.
func (f *Feed) Hub() *quantum.Hub { return f.hub }

// Publish encodes q and appends it to the hub (see quantum.Hub.Publish).
func (f *Feed) Publish(q quantum.Quantum, after *assignment.Assignment) error {
	data, err := Encode(q)
	if err != nil {
		return err
	}
	f.encoded.put(q.Position, data)
	return f.hub.Publish(q, after)
}

// Encode returns the wire form of a watch response carrying q (WatchQuantaResponse and
// WatchAssignmentResponse share it).
func Encode(q quantum.Quantum) ([]byte, error) {
	data, err := proto.Marshal(&pb.WatchQuantaResponse{Quantum: wire.QuantumToProto(q)})
	if err != nil {
		return nil, fmt.Errorf("mapserve: encoding %s: %w", q.Position, err)
	}
	return data, nil
}

// encode returns the encoding of a quantum a watcher is to send. The hub's own
// reinitializing quanta (cause "reinit", for a watcher starting over) share their position
// with the published quantum they follow, so they are told apart by their cause and encoded
// once per position.
func (f *Feed) encode(q quantum.Quantum) ([]byte, error) {
	if q.Cause == "reinit" {
		return f.reinits.get(q)
	}
	if data, ok := f.encoded.get(q.Position); ok {
		return data, nil
	}
	return Encode(q) // a watcher so far behind that its quantum's bytes are gone
}

// reinitCache holds the encoding of the last reinitializing quantum. When many watchers
// connect at once (after a failover, all of them), the map is encoded once, not once per
// watcher: for 150k slices that is 4.5 MB each time, and encoding it a hundred times over
// starved the leader's own etcd lease in a benchmark.
type reinitCache struct {
	mu   sync.Mutex
	pos  quantum.Position
	gen  uint64
	data []byte
}

func (c *reinitCache) get(q quantum.Quantum) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.data != nil && c.pos == q.Position && c.gen == q.Generation {
		return c.data, nil
	}
	data, err := Encode(q)
	if err != nil {
		return nil, err
	}
	c.pos, c.gen, c.data = q.Position, q.Generation, data
	return data, nil
}

// encodings holds the encodings of a hub's recent quanta by position, bounded as the hub is.
type encodings struct {
	mu    sync.Mutex
	data  map[quantum.Position][]byte
	order []quantum.Position // oldest first
	bytes int
}

// Bounds of encodings, those of the hub's defaults.
const (
	maxEncodings     = 4096
	maxEncodingBytes = 64 << 20
)

func (e *encodings) put(pos quantum.Position, data []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.data == nil {
		e.data = map[quantum.Position][]byte{}
	}
	e.data[pos] = data
	e.order = append(e.order, pos)
	e.bytes += len(data)
	for len(e.order) > 1 && (len(e.order) > maxEncodings || e.bytes > maxEncodingBytes) {
		e.bytes -= len(e.data[e.order[0]])
		delete(e.data, e.order[0])
		e.order = e.order[1:]
	}
}

func (e *encodings) get(pos quantum.Position) ([]byte, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	data, ok := e.data[pos]
	return data, ok
}

// Server serves the map of the feed Feed returns.
type Server struct {
	// Name prefixes errors: "assigner", "relay".
	Name string
	// Feed returns the feed to serve, or a gRPC status saying why there is none (not the
	// leader, no map followed yet).
	Feed func() (*Feed, error)
	// Closed is the message of the Unavailable status a watch ends with when its hub
	// closes (its leader stepped down, its relay lost the stream).
	Closed string
	// Watchers counts the open watches; nil counts nothing.
	Watchers prometheus.Gauge
	// NoMap is the status of a call made before the hub has a map.
	NoMap error
	// Live, if set, is asked before each heartbeat: a watch whose server can no longer
	// vouch for its map (a relay that lost the assigner's stream) ends with its error
	// instead of telling the watcher all is well.
	Live func() error
	// Nodes, if set, returns the node list the server keeps, for the watchers that ask for
	// it (Want.Nodes): a relay's copy of the assigner's.
	Nodes func() NodeList
}

// Want is what a watcher asks of a watch.
type Want struct {
	// From is the last position the watcher applied; nil for the whole map.
	From *pb.Position
	// ClockQuanta asks for the quanta that only advance the clock too.
	ClockQuanta bool
	// Heartbeat is how long the stream may stay idle (see interval); nil for the default.
	Heartbeat *durationpb.Duration
	// Nodes asks for the node list, first and whenever it changes, from a server that keeps
	// one (Server.Nodes).
	Nodes bool
}

// Watch streams the feed's quanta to stream after position want.From: a reinitializing
// quantum first unless that is a position the hub still holds, and a heartbeat whenever the
// stream has been idle for want.Heartbeat. The node list, if asked for and kept, goes first
// and again, once the watch wakes (for a quantum or a heartbeat), whenever it changed.
func (s *Server) Watch(stream grpc.ServerStream, want Want) error {
	every, err := interval(want.Heartbeat)
	if err != nil {
		return err
	}
	f, err := s.Feed()
	if err != nil {
		return err
	}
	sub := f.hub.Subscribe(wire.PositionFromProto(want.From), want.ClockQuanta)
	if s.Watchers != nil {
		s.Watchers.Inc()
		defer s.Watchers.Dec()
	}
	nodes := nodeSender{stream: stream}
	if want.Nodes {
		nodes.list = s.Nodes
	}
	if _, err := nodes.send(); err != nil {
		return err
	}
	for {
		q, err := next(stream.Context(), sub, every)
		if errors.Is(err, errIdle) {
			if err := s.idle(stream, &nodes); err != nil {
				return err
			}
			continue
		}
		if errors.Is(err, quantum.ErrClosed) {
			return status.Error(codes.Unavailable, s.Closed)
		}
		if err != nil {
			return status.FromContextError(err).Err()
		}
		if _, err := nodes.send(); err != nil {
			return err
		}
		data, err := f.encode(q)
		if err != nil {
			return status.Errorf(codes.Internal, "%s: %v", s.Name, err)
		}
		if err := stream.SendMsg(&frame.Frame{Data: data}); err != nil {
			return err
		}
	}
}

// idle tells the watcher of an idle stream that the server is alive: with the node list if
// it changed, with a heartbeat otherwise, so that watchers tell an idle server from a hung
// one. A server that can no longer vouch for its map (Live) ends the watch instead.
func (s *Server) idle(stream grpc.ServerStream, nodes *nodeSender) error {
	if s.Live != nil {
		if err := s.Live(); err != nil {
			return err
		}
	}
	if sent, err := nodes.send(); sent || err != nil {
		return err
	}
	return stream.SendMsg(&frame.Frame{Data: heartbeatFrame})
}

// NodeList is a node list encoded as a watch response (EncodeNodes), with a version that
// changes whenever the list does; version 0 is no list yet.
type NodeList struct {
	Version uint64
	Data    []byte
}

// EncodeNodes returns the wire form of a watch response carrying the node list l.
func EncodeNodes(l *pb.ListNodesResponse) ([]byte, error) {
	data, err := proto.Marshal(&pb.WatchAssignmentResponse{Nodes: l})
	if err != nil {
		return nil, fmt.Errorf("mapserve: encoding the node list: %w", err)
	}
	return data, nil
}

// nodeSender sends a watcher the node list when it changed since it last did; with no list
// function, it sends nothing.
type nodeSender struct {
	stream grpc.ServerStream
	list   func() NodeList
	sent   uint64 // the version last sent
}

func (n *nodeSender) send() (bool, error) {
	if n.list == nil {
		return false, nil
	}
	l := n.list()
	if l.Version == n.sent || l.Data == nil {
		return false, nil
	}
	n.sent = l.Version
	return true, n.stream.SendMsg(&frame.Frame{Data: l.Data})
}

// errIdle says a watch had nothing to send for a heartbeat interval.
var errIdle = errors.New("mapserve: idle")

// heartbeatFrame is the encoding of a watch response that only says the server is alive.
var heartbeatFrame, _ = proto.Marshal(&pb.WatchQuantaResponse{Heartbeat: true})

// interval returns the heartbeat interval a watcher asked for: dial.StreamHeartbeat if
// unset; a status INVALID_ARGUMENT if it is not between that and dial.MaxStreamHeartbeat.
func interval(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return dial.StreamHeartbeat, nil
	}
	every := d.AsDuration()
	if d.CheckValid() != nil || every < dial.StreamHeartbeat || every > dial.MaxStreamHeartbeat {
		return 0, status.Errorf(codes.InvalidArgument, "mapserve: heartbeat %s: want between %s and %s",
			every, dial.StreamHeartbeat, dial.MaxStreamHeartbeat)
	}
	return every, nil
}

// next returns the subscription's next quantum, or errIdle after every without one.
func next(ctx context.Context, sub *quantum.Subscription, every time.Duration) (quantum.Quantum, error) {
	wait, cancel := context.WithTimeout(ctx, every)
	defer cancel()
	q, err := sub.Next(wait)
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return q, errIdle
	}
	return q, err
}

// current returns the feed's map, or the status saying why there is none.
func (s *Server) current() (*assignment.Assignment, quantum.Position, uint64, error) {
	f, err := s.Feed()
	if err != nil {
		return nil, quantum.Position{}, 0, err
	}
	m, pos, clock := f.hub.Current()
	if m == nil {
		return nil, pos, clock, s.NoMap
	}
	return m, pos, clock, nil
}

// GetAssignment returns the whole current map.
func (s *Server) GetAssignment() (*pb.GetAssignmentResponse, error) {
	m, pos, clock, err := s.current()
	if err != nil {
		return nil, err
	}
	return &pb.GetAssignmentResponse{Position: wire.PositionToProto(pos), Clock: clock, Assignment: wire.AssignmentToProto(m)}, nil
}

// Lookup returns the slice and replicas holding a key or hash.
func (s *Server) Lookup(req *pb.LookupRequest) (*pb.LookupResponse, error) {
	var h uint64
	switch t := req.GetTarget().(type) {
	case *pb.LookupRequest_Key:
		if len(t.Key) > MaxLookupKey {
			return nil, status.Errorf(codes.InvalidArgument, "%s: a key of %d bytes; at most %d", s.Name, len(t.Key), MaxLookupKey)
		}
		h = keyspace.Hash(t.Key)
	case *pb.LookupRequest_Hash:
		h = t.Hash
	default:
		return nil, status.Errorf(codes.InvalidArgument, "%s: lookup needs a key or a hash", s.Name)
	}
	m, _, _, err := s.current()
	if err != nil {
		return nil, err
	}
	_, sl := m.Lookup(h)
	replicas := make([]string, len(sl.Replicas))
	for i, n := range sl.Replicas {
		replicas[i] = string(n)
	}
	return &pb.LookupResponse{Hash: h, Slice: wire.RangeToProto(sl.Range), Replicas: replicas, Generation: m.Generation(),
		Primary: string(sl.Primary), Next: string(sl.Next), Token: sl.Token}, nil
}
