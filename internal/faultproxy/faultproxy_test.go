package faultproxy_test

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/faultproxy"
)

// echo serves connections that write back what they read, until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { defer c.Close(); io.Copy(c, c) }) //nolint:errcheck // ends with the connection
		}
	})
	return lis.Addr().String()
}

func roundTrip(c net.Conn, msg string) error {
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) //nolint:errcheck // a net.Conn's
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return err
}

// A stream stalled by StallExisting neither answers nor resets, while a stream opened later
// works; DropStalled then ends the stalled one.
func TestStallExistingHoldsOpenStreamsOnly(t *testing.T) {
	p, err := faultproxy.New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	old, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := roundTrip(old, "before"); err != nil {
		t.Fatalf("before the stall: %v", err)
	}
	if n := p.Open(); n != 1 {
		t.Fatalf("%d connections open, want 1", n)
	}
	p.StallExisting()
	var ne net.Error
	if err := roundTrip(old, "held"); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("a stalled stream: %v, want a read timeout (no data, no reset)", err)
	}
	fresh, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := roundTrip(fresh, "fresh"); err != nil {
		t.Errorf("a stream opened during the stall: %v", err)
	}
	p.DropStalled()
	old.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a net.Conn's
	if _, err := old.Read(make([]byte, 16)); err == nil {
		t.Error("a dropped stream still reads; want it closed")
	}
	if err := roundTrip(fresh, "after"); err != nil {
		t.Errorf("the later stream after the drop: %v", err)
	}
}
