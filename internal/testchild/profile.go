package testchild

import (
	"os"
	"path/filepath"
	"runtime/pprof"
)

// Profile starts a CPU profile of this process into name.pprof in the directory the
// environment variable env names, and returns what stops it; with env unset, or the profile
// not started (another one runs), it does nothing. The fleets' benchmarks use it to profile
// a child, and their own process, over one measurement rather than the whole run.
func Profile(env, name string) (stop func()) {
	dir := os.Getenv(env)
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}
