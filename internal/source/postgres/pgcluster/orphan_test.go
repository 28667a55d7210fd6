package pgcluster_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
)

// helperEnv makes this test binary a helper process that starts a cluster in the directory
// it names, says "ready" and waits until killed (or its input closes).
const helperEnv = "PGCLUSTER_TEST_HELPER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		_, err := pgcluster.Start(ctx, dir, pgcluster.Options{})
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin) //nolint:errcheck // either ends the helper
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestAKilledParentLeavesNoServer kills a process that started a cluster (SIGKILL, as a CI
// job's timeout does to a test binary): the server, and every process of it, exits.
func TestAKilledParentLeavesNoServer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	if err := pgcluster.Installed(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	parent, line, err := launch.StartHelper([]string{helperEnv + "=" + dir}, 2*time.Minute)
	if err != nil || line != "ready" {
		t.Fatalf("the parent did not start a cluster: %q, %v", line, err)
	}
	defer func() {
		parent.Signal(syscall.SIGKILL) //nolint:errcheck // the test failed early, or it is dead
		parent.Wait()                  //nolint:errcheck // killed
	}()
	server := serverProcesses(t, filepath.Join(dir, "data", "postmaster.pid"))
	// Whatever happens below, the server must not outlive the test.
	defer func() {
		for _, pid := range server {
			syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // it should be gone already
		}
	}()

	if err := parent.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	parent.Wait() //nolint:errcheck // killed
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = launch.WaitExited(ctx, server...)
	if err != nil {
		t.Fatal(err)
	}
}

// serverProcesses returns the process IDs of the server whose postmaster.pid is at path
// and of its processes (checkpointer, WAL writer and the others).
func serverProcesses(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		t.Fatal(err)
	}
	pids := []int{pm}
	for _, p := range procs {
		if st, err := p.Stat(); err == nil && st.PPID == pm {
			pids = append(pids, p.PID)
		}
	}
	if len(pids) < 2 || !launch.Running(pm) {
		t.Fatalf("the server %d runs no process of its own: %v", pm, pids)
	}
	t.Logf("the server's processes: %v", pids)
	return pids
}
