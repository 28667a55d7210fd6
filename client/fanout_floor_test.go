package client_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/testchild"
)

// floorMessage is the size of the floor's messages: that of a split quantum's watch response
// as a relay writes it, 165 bytes of protobuf, gRPC's 5-byte prefix and an HTTP/2 frame
// header of 9.
const floorMessage = 179

// floorServer is the fan-out's floor on this machine: it writes each message to every
// connection it accepted, over mutual TLS alone (no gRPC, HTTP/2, heartbeats or map), with
// a goroutine per connection as a relay has one per watch. What a relay takes beyond it is
// the cost of its protocol, not of the machine.
type floorServer struct {
	ln    net.Listener
	mu    sync.Mutex
	msgs  [][]byte      // every message sent, in order
	wake  chan struct{} // closed when a message is sent, then replaced
	conns int
	wg    sync.WaitGroup
}

// startFloor listens on loopback with src's certificate and serves until b ends.
func startFloor(b *testing.B, src *mtls.Source) *floorServer {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", src.ServerTLS())
	require.NoError(b, err)
	s := &floorServer{ln: ln, wake: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	s.wg.Go(func() { s.accept(ctx) })
	b.Cleanup(func() { cancel(); ln.Close(); s.wg.Wait() })
	return s
}

func (s *floorServer) accept(ctx context.Context) {
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() { s.write(ctx, conn.(*tls.Conn)) })
	}
}

// write shakes hands on conn, then sends it every message sent from then on, until ctx ends
// or conn fails.
func (s *floorServer) write(ctx context.Context, conn *tls.Conn) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if conn.HandshakeContext(ctx) != nil {
		return
	}
	s.mu.Lock()
	s.conns++
	sent := len(s.msgs)
	s.mu.Unlock()
	for {
		s.mu.Lock()
		msgs, wake := s.msgs[sent:], s.wake
		s.mu.Unlock()
		for _, m := range msgs {
			if _, err := conn.Write(m); err != nil {
				return
			}
		}
		sent += len(msgs)
		select {
		case <-wake:
		case <-ctx.Done():
			return
		}
	}
}

// connected returns how many connections the floor accepted.
func (s *floorServer) connected() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// send sends every connection a message stamped with the time it is sent.
func (s *floorServer) send() {
	m := make([]byte, floorMessage)
	binary.BigEndian.PutUint64(m, uint64(time.Now().UnixNano()))
	s.mu.Lock()
	s.msgs = append(s.msgs, m)
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
}

// floor runs n readers of a floorServer in a child process and measures, round by round,
// the time from a message's sending to its receipt.
func (f *relayFleet) floor(b *testing.B, n int, rounds []fanOutRound) []watcherResult {
	server, err := f.c.PKI.Config("distributor", "floor").Load()
	require.NoError(b, err)
	s := startFloor(b, server)
	c := startWatcherChild(b, watcherSpec{Floor: s.ln.Addr().String(), N: n, TLS: f.router})
	require.Eventually(b, func() bool { return s.connected() == n }, time.Minute, 10*time.Millisecond,
		"the floor accepts every reader: %d of %d", s.connected(), n)
	var res []watcherResult
	for _, r := range rounds {
		c.Send(b, watcherRound{Name: "floor-" + r.Name, Splits: r.Splits})
		stop := testchild.Profile(fanOutProfileEnv, "floor-every-"+r.Name)
		for range r.Splits {
			s.send()
			time.Sleep(r.Gap)
		}
		res = append(res, watcherResultOf(b, c))
		stop()
	}
	c.Stop(b)
	return res
}

// readFloor connects n readers to the floor at addr, 250 at a time as watch does, and
// returns once each has connected; wait waits for them to end, after ctx.
func readFloor(ctx context.Context, cfg *tls.Config, addr string, n int) (*latencies, func(), error) {
	var wg sync.WaitGroup
	lat := &latencies{}
	for lo := 0; lo < n; lo += 250 {
		conns := make([]*tls.Conn, min(250, n-lo))
		errs := make([]error, len(conns))
		var batch sync.WaitGroup
		for i := range conns {
			batch.Go(func() {
				d := tls.Dialer{Config: cfg, NetDialer: &net.Dialer{Timeout: 30 * time.Second}}
				c, err := d.DialContext(ctx, "tcp", addr)
				if err == nil {
					conns[i] = c.(*tls.Conn)
				}
				errs[i] = err
			})
		}
		batch.Wait()
		if err := errors.Join(errs...); err != nil {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
			return nil, wg.Wait, fmt.Errorf("floor reader: %w", err)
		}
		for _, c := range conns {
			wg.Go(func() { readMessages(ctx, c, lat) })
		}
	}
	return lat, wg.Wait, nil
}

// readMessages reads floor messages from c until ctx ends, noting each one's latency.
func readMessages(ctx context.Context, c *tls.Conn, lat *latencies) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	m := make([]byte, floorMessage)
	for {
		if _, err := io.ReadFull(c, m); err != nil {
			return
		}
		lat.add(time.Since(time.Unix(0, int64(binary.BigEndian.Uint64(m)))))
	}
}
