package launch

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"
)

// StartHelper starts this test binary again, running no test, with env added: a helper
// process that writes one line to its standard output once it is ready, then runs until it
// is killed or its input closes (as it does when the test that started it dies). It returns
// the helper and that line, without its newline; the helper is killed if it says nothing
// within patience. The tests that kill a parent to see its children die start the parent so.
func StartHelper(env []string, patience time.Duration) (*Child, string, error) {
	out, w, err := os.Pipe()
	if err != nil {
		return nil, "", fmt.Errorf("launch: a helper's output: %w", err)
	}
	defer out.Close()
	in, hold, err := os.Pipe()
	if err != nil {
		w.Close()
		return nil, "", fmt.Errorf("launch: a helper's input: %w", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, w, os.Stderr
	c, err := StartChild(cmd)
	in.Close()
	w.Close()
	if err != nil {
		hold.Close()
		return nil, "", err
	}
	// The write end of its input stays open while the helper runs: its end is the helper's.
	go func() { <-c.Done(); hold.Close() }()
	out.SetReadDeadline(time.Now().Add(patience)) //nolint:errcheck // a pipe takes deadlines
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		c.Signal(syscall.SIGKILL) //nolint:errcheck // it may have died
		c.Wait()                  //nolint:errcheck // killed
		return nil, "", fmt.Errorf("launch: the helper said nothing: %w", err)
	}
	return c, line[:len(line)-1], nil
}

// WaitExited waits until none of the processes pids runs (see Running), or ctx ends; its
// error says which still run.
func WaitExited(ctx context.Context, pids ...int) error {
	return WaitFor(ctx, "processes to exit", 10*time.Millisecond, func(context.Context) error {
		left := slices.DeleteFunc(slices.Clone(pids), func(pid int) bool { return !Running(pid) })
		if len(left) > 0 {
			return fmt.Errorf("%d of %d run: %v", len(left), len(pids), left)
		}
		return nil
	})
}
