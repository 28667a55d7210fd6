package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes this test binary a helper process of the tests below: "parent" starts a
// "sleeper" with Start, prints its process ID and waits; a "sleeper" sleeps until killed.
const helperEnv = "LAUNCH_TEST_HELPER"

// helper runs the helper process named by helperEnv, if this is one, and exits.
func helper() {
	switch os.Getenv(helperEnv) {
	case "":
		return
	case "sleeper":
		for {
			time.Sleep(time.Hour)
		}
	case "parent":
		os.Setenv(helperEnv, "sleeper") //nolint:errcheck // a valid name
		p, err := Start("sleeper", os.Args[0], []string{"-test.run=^$"}, os.Getenv("LAUNCH_TEST_LOGS"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(p.Pid())
		// Until the test kills it, or its input closes, as it does if the test died.
		io.Copy(io.Discard, os.Stdin) //nolint:errcheck // either ends the helper
		os.Exit(0)
	}
	fmt.Fprintf(os.Stderr, "%s: unknown helper %q\n", helperEnv, os.Getenv(helperEnv))
	os.Exit(2)
}

// TestAChildDiesWithItsKilledParent kills a process (SIGKILL, as a CI job's timeout does to
// a test binary) that started a child with Start: the kernel kills the child too, though
// it runs in its own process group and no code of its parent's ran.
func TestAChildDiesWithItsKilledParent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	parent, line, err := StartHelper([]string{helperEnv + "=parent", "LAUNCH_TEST_LOGS=" + t.TempDir()}, time.Minute)
	if err != nil {
		t.Fatalf("the parent said no child: %v", err)
	}
	defer func() {
		parent.Signal(syscall.SIGKILL) //nolint:errcheck // the test failed early, or it is dead
		parent.Wait()                  //nolint:errcheck // killed
	}()
	child, err := strconv.Atoi(line)
	if err != nil {
		t.Fatalf("the parent's child %q: %v", line, err)
	}
	// Whatever happens below, the child must not outlive the test.
	defer syscall.Kill(child, syscall.SIGKILL) //nolint:errcheck // it should be gone already
	if !Running(child) {
		t.Fatalf("the child %d does not run", child)
	}

	if err := parent.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := parent.Wait(); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the parent's exit: %v; want killed", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := WaitExited(ctx, child); err != nil {
		t.Fatal(err)
	}
}
