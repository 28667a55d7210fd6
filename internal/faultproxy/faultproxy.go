// Package faultproxy is a TCP proxy for tests that can stall a link: it stops forwarding
// bytes in both directions and holds them, without resetting anything, as a link that
// drops every packet does (a hung switch, a firewall that blackholes, a peer that froze).
package faultproxy

import (
	"net"
	"sync"
)

// Proxy forwards the connections it accepts to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	stalled bool // new links start stalled
	links   map[*link]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// link is one proxied connection: its two ends and its gate.
type link struct {
	in, out net.Conn
	mu      sync.Mutex
	resumed chan struct{} // closed while forwarding; open while stalled
}

func (l *link) stall() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.resumed:
		l.resumed = make(chan struct{})
	default:
	}
}

func (l *link) resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.resumed:
	default:
		close(l.resumed)
	}
}

func (l *link) isStalled() bool {
	select {
	case <-l.gate():
		return false
	default:
		return true
	}
}

func (l *link) gate() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.resumed
}

// New starts a proxy on a free loopback port to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is where the proxy listens.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stall stops forwarding on every connection, the ones made later included: bytes read
// from either side are held until Resume.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = true
	for l := range p.links {
		l.stall()
	}
}

// StallExisting stalls the connections open now and leaves later ones alone: a peer's old
// connection hangs while a new one works.
func (p *Proxy) StallExisting() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.stall()
	}
}

// Open returns how many connections the proxy holds open now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// DropStalled closes the connections stalled now, as a dead link at last ends (a timeout, a
// reset): their peers must dial again. Later connections are left alone.
func (p *Proxy) DropStalled() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		if l.isStalled() {
			l.in.Close()
			l.out.Close()
			l.resume() // the pipes waiting at the gate find their connections closed and end
		}
	}
}

// Resume forwards again on every connection, starting with the bytes held.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = false
	for l := range p.links {
		l.resume()
	}
}

// Close stops the proxy and closes every connection; it returns when all its goroutines
// have.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for l := range p.links {
		l.in.Close()
		l.out.Close()
		l.resume()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		l := &link{in: in, out: out, resumed: make(chan struct{})}
		if !p.track(l) {
			return
		}
		p.wg.Add(2)
		go p.pipe(l, in, out)
		go p.pipe(l, out, in)
	}
}

// track records a link, or closes it if the proxy is closed.
func (p *Proxy) track(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		l.in.Close()
		l.out.Close()
		return false
	}
	if !p.stalled {
		close(l.resumed)
	}
	p.links[l] = struct{}{}
	return true
}

// pipe copies from src to dst, waiting at the link's gate before every write.
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	defer p.forget(l)
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-l.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: the other pipe ends when dst closes
		}
	}
}

func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.links, l)
}
