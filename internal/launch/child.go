package launch

import (
	"bytes"
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
)

// Child is a process started with StartChild: one that does not outlive this process.
type Child struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // cmd.Wait's, set before done is closed
}

// StartChild starts cmd so that it dies with this process, however this process ends: the
// kernel kills it (SIGKILL) when this process dies, be it by a signal no handler sees
// (SIGKILL, as a CI job's timeout sends) or a crash, which no cleanup code survives. A
// test interrupted that way once left its whole cluster running. The processes the tests
// and the demos start go through here; a process that daemonizes escapes it (its child is
// no child of ours), so none is started that way: PostgreSQL runs in the foreground.
//
// StartChild also waits for cmd: call Wait or Done, never cmd.Wait. It keeps cmd's
// SysProcAttr (a process group of its own, for one) and adds the parent-death signal
// (Linux; elsewhere a child may outlive a killed parent).
func StartChild(cmd *exec.Cmd) (*Child, error) {
	c, err := startChild(cmd)
	if err != nil {
		return nil, fmt.Errorf("launch: starting %s: %w", cmd.Path, err)
	}
	return c, nil
}

// startChild is StartChild, its error unwrapped.
func startChild(cmd *exec.Cmd) (*Child, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	dieWithParent(cmd.SysProcAttr)
	c := &Child{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The kernel sends the parent-death signal when the thread that forked the child
		// exits, not the process (go.dev/issue/27505). The Go runtime ends a thread only
		// when a goroutine locked to it exits still locked: had the caller's goroutine been
		// locked and then returned, its child would have been killed with the thread. This
		// goroutine is locked to its thread from the fork until the child has exited, so
		// that thread outlives the child; unlocked afterwards, it returns to the runtime's
		// pool. The wait would hold a thread anyway: it blocks in a system call.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		c.err = cmd.Wait()
		close(c.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return c, nil
}

// Pid returns the child's process ID.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Signal sends the child sig; it may have exited already.
func (c *Child) Signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }

// Done is closed once the child has exited and been waited for.
func (c *Child) Done() <-chan struct{} { return c.done }

// Wait waits until the child has exited and returns what cmd.Wait did: nil, or an
// *exec.ExitError for an exit status other than 0 or a signal.
func (c *Child) Wait() error {
	<-c.done
	return c.err
}

// Run runs cmd as StartChild does and waits for it, as cmd.Run does: for short commands,
// which must not outlive this process either (a build or an initdb a killed test left
// behind would go on writing into its directory).
func Run(cmd *exec.Cmd) error {
	c, err := StartChild(cmd)
	if err != nil {
		return err
	}
	return c.Wait()
}

// CombinedOutput runs cmd as Run does and returns its output, stdout and stderr together,
// as cmd.CombinedOutput does.
func CombinedOutput(cmd *exec.Cmd) ([]byte, error) {
	var b bytes.Buffer
	// One writer for both: exec.Cmd then gives the child a single pipe, so that the
	// output keeps its order.
	cmd.Stdout, cmd.Stderr = &b, &b
	err := Run(cmd)
	return b.Bytes(), err
}
