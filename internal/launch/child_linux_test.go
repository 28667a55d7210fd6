package launch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestAChildOutlivesTheThreadThatStartedIt starts a child from a goroutine locked to its
// thread, which ends with the goroutine: the parent-death signal follows the thread that
// forked the child, so StartChild must not fork on its caller's thread.
func TestAChildOutlivesTheThreadThatStartedIt(t *testing.T) {
	t.Setenv(helperEnv, "sleeper")
	type started struct {
		p   *Proc
		tid int
		err error
	}
	ch := make(chan started, 1)
	start := func() {
		runtime.LockOSThread() // and never unlocked: the thread ends with this goroutine
		p, err := Start("sleeper", os.Args[0], []string{"-test.run=^$"}, t.TempDir())
		ch <- started{p, syscall.Gettid(), err}
	}
	go func() {
		runtime.LockOSThread()
		if syscall.Gettid() != os.Getpid() {
			start() // and exit locked, twice
			return
		}
		// The process's first thread never ends: the runtime parks it when a goroutine
		// locked to it exits. Held here, it cannot be the thread of start's goroutine.
		done := make(chan struct{})
		go func() {
			defer close(done)
			start()
		}()
		<-done
		runtime.UnlockOSThread()
	}()
	s := <-ch
	if s.err != nil {
		t.Fatal(s.err)
	}
	defer s.p.Kill()
	task := filepath.Join("/proc/self/task", strconv.Itoa(s.tid))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := WaitFor(ctx, "the starting thread to end", 10*time.Millisecond, func(context.Context) error {
		if _, err := os.Stat(task); err == nil {
			return errors.New("it runs")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The kernel sends the signal as the thread ends: a child it was sent to is dead
	// within this wait, which passes only if none was.
	select {
	case <-s.p.Done():
		t.Fatalf("the child died with the thread that started it: %v", s.p.child.Wait())
	case <-time.After(500 * time.Millisecond):
	}
}
