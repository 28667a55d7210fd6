// Package launch starts and stops the processes of a multi-process Sliceplane on one
// machine: the demo and the end-to-end tests build the real binaries and run them, each
// with its own log file, in its own process group (so that a Ctrl-C in the terminal reaches
// only the launcher, which then stops them in order), and killed by the kernel if the
// launcher dies without stopping them (StartChild).
package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// Proc is a started process.
type Proc struct {
	Name string
	// LogPath is the file holding the process's stdout and stderr.
	LogPath string

	child *Child

	mu      sync.Mutex
	stopped bool // Stop or Kill asked for the exit
}

// Start starts bin with args; its output goes to logDir/name.log (appended, so that a
// restarted process keeps one log).
func Start(name, bin string, args []string, logDir string) (*Proc, error) {
	path := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("launch: %s: %w", name, err)
	}
	fmt.Fprintf(f, "### %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	child, err := startChild(cmd)
	// The child has its own copy of the log's descriptor.
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("launch: starting %s (%s): %w", name, bin, err)
	}
	return &Proc{Name: name, LogPath: path, child: child}, nil
}

// Pid returns the process ID.
func (p *Proc) Pid() int { return p.child.Pid() }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.child.Done() }

// Exited reports whether the process has exited, and how, if it did by itself: an exit that
// Stop or Kill asked for is not an error.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.child.Done():
	default:
		return false, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return true, nil
	}
	return true, fmt.Errorf("launch: %s exited: %v (log: %s)", p.Name, p.child.Wait(), p.LogPath)
}

// Kill kills the process at once (SIGKILL) and waits for it.
func (p *Proc) Kill() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.child.Signal(syscall.SIGKILL) //nolint:errcheck // it may have exited already
	p.child.Wait()                  //nolint:errcheck // killed: its exit says nothing
}

// Stop asks the process to stop (SIGTERM) and waits up to grace for it, then kills it. It
// returns an error if the process did not exit cleanly by itself within grace.
func (p *Proc) Stop(grace time.Duration) error {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.child.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited already
	select {
	case <-p.child.Done():
		var exit *exec.ExitError
		if err := p.child.Wait(); errors.As(err, &exit) && !exit.Success() {
			return fmt.Errorf("launch: %s stopped with %v (log: %s)", p.Name, err, p.LogPath)
		}
		return nil
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("launch: %s did not stop within %s; killed (log: %s)", p.Name, grace, p.LogPath)
	}
}

// Tail returns the last n lines of the process's log, for error messages.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// FreeAddrs returns n distinct loopback addresses with ports free at the time of the call.
// Another process may take one before it is used; callers that cannot retry should start
// what listens soon after.
func FreeAddrs(n int) ([]string, error) {
	var out []string
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("launch: finding a free port: %w", err)
		}
		listeners = append(listeners, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// Build builds the main packages pkgs (import paths or ./relative to dir) into outDir with
// `go build`, from the module at dir. race builds them with the race detector, which shares
// the build cache of `go test -race`.
func Build(ctx context.Context, dir, outDir string, race bool, pkgs ...string) error {
	args := []string{"build", "-o", outDir + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	cmd.Dir = dir
	out, err := CombinedOutput(cmd)
	if err != nil {
		return fmt.Errorf("launch: go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Permanent marks an error that ends a WaitFor at once.
func Permanent(err error) error { return permanent{err} }

type permanent struct{ error }

func (p permanent) Unwrap() error { return p.error }

// WaitFor calls ok every poll until it returns nil or ctx ends; it returns ok's last error
// then, wrapped with what. An error made by Permanent ends the wait at once.
func WaitFor(ctx context.Context, what string, poll time.Duration, ok func(context.Context) error) error {
	for {
		err := ok(ctx)
		var perm permanent
		switch {
		case err == nil:
			return nil
		case errors.As(err, &perm):
			return fmt.Errorf("launch: waiting for %s: %w", what, perm.error)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("launch: waiting for %s: %w (last: %w)", what, ctx.Err(), err)
		case <-time.After(poll):
		}
	}
}

// CPUSeconds returns the CPU time, user and system, that process pid has used (Linux).
func CPUSeconds(pid int) (float64, error) {
	p, err := procfs.NewProc(pid)
	if err == nil {
		var st procfs.ProcStat
		if st, err = p.Stat(); err == nil {
			return st.CPUTime(), nil
		}
	}
	return 0, fmt.Errorf("launch: the CPU time of process %d: %w", pid, err)
}

// Running reports whether process pid runs (Linux): false once it has exited, its zombie
// awaiting a wait or not (an orphan's new parent, PID 1 in a container, may never wait).
func Running(pid int) bool {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return false
	}
	st, err := p.Stat()
	return err == nil && st.State != "Z" && st.State != "X"
}
