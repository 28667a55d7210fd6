package chaos_test

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// holdProxy forwards TCP connections and can hold the bytes of the connections open at one
// moment, with no reset, while later connections pass: a dead stream on a live path, which
// a client notices only by the silence. toxiproxy's toxics apply to every connection of a
// proxy, new ones included, so they model a dead path instead.
type holdProxy struct {
	lis      net.Listener
	upstream string

	mu    sync.Mutex
	conns map[*heldConn]bool
	wg    sync.WaitGroup
}

// heldConn is one forwarded connection; while held, its copies stop before writing.
type heldConn struct {
	down, up net.Conn
	mu       sync.Mutex
	cond     *sync.Cond
	held     bool
}

func newHoldProxy(upstream string) (*holdProxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: hold proxy: %w", err)
	}
	p := &holdProxy{lis: lis, upstream: upstream, conns: map[*heldConn]bool{}}
	p.wg.Go(p.accept)
	return p, nil
}

func (p *holdProxy) addr() string { return p.lis.Addr().String() }

func (p *holdProxy) accept() {
	for {
		down, err := p.lis.Accept()
		if err != nil {
			return // closed
		}
		up, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
		if err != nil {
			down.Close()
			continue
		}
		c := &heldConn{down: down, up: up}
		c.cond = sync.NewCond(&c.mu)
		p.mu.Lock()
		p.conns[c] = true
		p.mu.Unlock()
		p.wg.Go(func() {
			var copies sync.WaitGroup
			copies.Go(func() { c.copy(c.up, c.down) })
			copies.Go(func() { c.copy(c.down, c.up) })
			copies.Wait()
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
		})
	}
}

// copy copies from src to dst until either fails, waiting while the connection is held;
// then it closes both, so that the other direction ends too.
func (c *heldConn) copy(dst, src net.Conn) {
	defer c.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			c.mu.Lock()
			for c.held {
				c.cond.Wait()
			}
			c.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (c *heldConn) close() {
	c.down.Close()
	c.up.Close()
	c.mu.Lock()
	c.held = false
	c.cond.Broadcast()
	c.mu.Unlock()
}

// hold holds every connection open now and returns a function that closes them: a held
// stream is dead for good, as a real one would be; the client must dial again.
func (p *holdProxy) hold() (release func()) {
	p.mu.Lock()
	var held []*heldConn
	for c := range p.conns {
		held = append(held, c)
	}
	p.mu.Unlock()
	for _, c := range held {
		c.mu.Lock()
		c.held = true
		c.mu.Unlock()
	}
	return func() {
		for _, c := range held {
			c.close()
		}
	}
}

// open returns how many connections are open now.
func (p *holdProxy) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *holdProxy) close() {
	p.lis.Close()
	p.mu.Lock()
	var open []*heldConn
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	for _, c := range open {
		c.close()
	}
	p.wg.Wait()
}
