package clustertest

import (
	"crypto/tls"
	"io"
	"net"
	"sync"

	"github.com/sliceplane/sliceplane/internal/mtls"
)

// secure puts a mutual TLS front with src's certificate before the plaintext server at
// target, and returns the front's address and a stop that stops the server (stopServer)
// and then the front. The front terminates TLS the way a TLS server would, verifying the
// client's certificate against the CA, so that clients exercise their TLS against it.
func (c *Cluster) secure(src *mtls.Source, target string, stopServer func()) (string, func()) {
	c.t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", src.ServerTLS())
	if err != nil {
		c.t.Fatalf("clustertest: %v", err)
	}
	f := &front{ln: ln, target: target, conns: map[net.Conn]bool{}}
	f.wg.Add(1)
	go f.accept()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopServer()
			f.close()
		})
	}
	c.t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// front forwards the connections it accepts to target.
type front struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]bool
}

func (f *front) accept() {
	defer f.wg.Done()
	for {
		in, err := f.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", f.target)
		if err != nil {
			in.Close()
			continue
		}
		if !f.track(in, out) {
			return
		}
		f.wg.Add(2)
		go f.pipe(in, out)
		go f.pipe(out, in)
	}
}

func (f *front) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		f.conns[c] = true
	}
	return true
}

// pipe copies src to dst; when either side ends, both close.
func (f *front) pipe(dst, src net.Conn) {
	defer f.wg.Done()
	io.Copy(dst, src) //nolint:errcheck // a closed link is how a copy ends
	dst.Close()
	src.Close()
}

func (f *front) close() {
	f.mu.Lock()
	f.closed = true
	f.ln.Close()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
