// Package testchild runs a test binary again as a child process that does one job for its
// test: a fleet of thousands of watchers or routers, which would not fit in the test's own
// process (its file descriptors) or would share its heap and so its measurements. The
// parent and the child speak in JSON lines: the child's spec in an environment variable,
// then requests on the child's input and answers on its output.
package testchild

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/sliceplane/sliceplane/internal/launch"
)

// ready is the line a child prints once its job is set up.
const ready = "ready"

// failure is the line a child prints when its job fails.
type failure struct {
	Error string `json:"error"`
}

// Child is the parent's side of a child process.
type Child struct {
	proc  *launch.Child
	in    *json.Encoder
	close func() error // the child's input
	out   *bufio.Scanner
}

// Start runs this test binary again with env set to spec's JSON, and stops it when t ends;
// the kernel kills it if the test binary dies first (launch.StartChild). The child's
// TestMain must call Main with the same env.
func Start(t testing.TB, env string, spec any) *Child {
	t.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatalf("testchild: the spec: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+string(data))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	// A pipe of our own rather than StdoutPipe, which the wait on the child closes as it
	// exits: the last line it wrote, its failure, would be lost.
	out, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	proc, err := launch.StartChild(cmd)
	w.Close()
	if err != nil {
		out.Close()
		t.Fatalf("testchild: %v", err)
	}
	t.Cleanup(func() {
		in.Close()
		proc.Signal(syscall.SIGKILL) //nolint:errcheck // it may have exited already
		proc.Wait()                  //nolint:errcheck // killed, or stopped and checked
		out.Close()
	})
	c := &Child{proc: proc, in: json.NewEncoder(in), close: in.Close, out: bufio.NewScanner(out)}
	c.out.Buffer(make([]byte, 64<<10), 64<<20)
	return c
}

// Ready waits until the child says its job is set up.
func (c *Child) Ready(t testing.TB) {
	t.Helper()
	if !c.out.Scan() || c.out.Text() != ready {
		t.Fatalf("testchild: the child did not get ready: %s", c.why())
	}
}

// Send sends the child a request.
func (c *Child) Send(t testing.TB, req any) {
	t.Helper()
	if err := c.in.Encode(req); err != nil {
		t.Fatalf("testchild: sending to the child: %v", err)
	}
}

// Recv reads the child's next answer into v.
func (c *Child) Recv(t testing.TB, v any) {
	t.Helper()
	if !c.out.Scan() {
		t.Fatalf("testchild: the child ended: %v", c.out.Err())
	}
	var f failure
	if json.Unmarshal(c.out.Bytes(), &f) == nil && f.Error != "" {
		t.Fatalf("testchild: the child failed: %s", f.Error)
	}
	if err := json.Unmarshal(c.out.Bytes(), v); err != nil {
		t.Fatalf("testchild: the child's answer %q: %v", c.out.Text(), err)
	}
}

// Stop closes the child's input, which ends its job, and waits for it to exit: what it held
// (connections, file descriptors) is then free for the next child.
func (c *Child) Stop(t testing.TB) {
	t.Helper()
	c.close()
	if err := c.proc.Wait(); err != nil {
		t.Fatalf("testchild: the child's exit: %v", err)
	}
}

// why says what the child printed instead of what was expected.
func (c *Child) why() string {
	if c.out.Err() != nil {
		return c.out.Err().Error()
	}
	var f failure
	if json.Unmarshal(c.out.Bytes(), &f) == nil && f.Error != "" {
		return f.Error
	}
	return fmt.Sprintf("%q", c.out.Text())
}

// Parent is the child's side: what its job reads and says.
type Parent struct {
	in  *bufio.Scanner
	out *json.Encoder
}

// Ready tells the parent the job is set up.
func (p *Parent) Ready() { fmt.Println(ready) }

// Send answers the parent.
func (p *Parent) Send(v any) error { return p.out.Encode(v) }

// Recv reads the parent's next request into v; false once the parent closed the input.
func (p *Parent) Recv(v any) bool {
	return p.in.Scan() && json.Unmarshal(p.in.Bytes(), v) == nil
}

// Main, called first in a test binary's TestMain, runs job and exits if this process is a
// child started with env, its spec decoded into spec; otherwise it returns at once.
func Main(env string, spec any, job func(*Parent) error) {
	data, ok := os.LookupEnv(env)
	if !ok {
		return
	}
	p := &Parent{in: bufio.NewScanner(os.Stdin), out: json.NewEncoder(os.Stdout)}
	err := json.Unmarshal([]byte(data), spec)
	if err == nil {
		err = job(p)
	}
	if err != nil {
		p.Send(failure{Error: fmt.Sprintf("%s: %v", env, err)})
		os.Exit(1)
	}
	os.Exit(0)
}
