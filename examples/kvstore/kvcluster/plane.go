package kvcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/target/registry"
)

// QuickAssignerArgs are a demo's assigner flags: quick passes and a short memory of load,
// so that the demo settles in seconds, and logs a machine reads.
var QuickAssignerArgs = []string{"--pass-interval", "1s", "--load-half-life", "2s", "--log-format", "json"}

// PlaneOptions shape a control plane.
type PlaneOptions struct {
	// Bin holds the binaries; Dir, etcd's data (Dir/etcd) and the logs (Dir/logs).
	Bin, Dir string
	// PKI issues every certificate; nil runs everything plaintext.
	PKI *launch.PKI
	// Assigners is how many assigners run (default 1), each with AssignerArgs.
	Assigners    int
	AssignerArgs []string
	// Targets are declared at start (the assigners' --targets file), each with its config;
	// the default target's config is AssignerArgs.
	Targets map[string]registry.Config
	Log     *slog.Logger
}

// Plane is a control plane: an etcd and its assigners. The clusters of one or more targets
// share it (Options.Plane), each running its own nodes or members against it.
type Plane struct {
	// PKI issued the plane's certificates; the clusters that share it take theirs from it.
	PKI *launch.PKI
	// TargetsFile is the assigners' --targets file; "" when PlaneOptions.Targets is empty.
	TargetsFile string
	etcd        *embedetcd.Server
	assigners   *Cluster
	stopped     sync.Once
}

// StartPlane starts etcd and the assigners, and waits until each serves; on error it stops
// what it started.
func StartPlane(ctx context.Context, opts PlaneOptions) (p *Plane, err error) {
	etcd, err := StartEtcd(ctx, opts.PKI, opts.Dir, opts.Log)
	if err != nil {
		return nil, err
	}
	p = &Plane{PKI: opts.PKI, etcd: etcd}
	defer func() {
		if err != nil {
			err, p = errors.Join(err, p.Stop(10*time.Second)), nil
		}
	}()
	args := opts.AssignerArgs
	if len(opts.Targets) > 0 {
		if p.TargetsFile, err = writeTargets(opts.Dir, opts.Targets); err != nil {
			return p, err
		}
		args = append(append([]string(nil), args...), "--targets", p.TargetsFile)
	}
	if p.assigners, err = New(Options{Bin: opts.Bin, Dir: opts.Dir, Etcd: []string{etcd.Endpoint()}, PKI: opts.PKI,
		AssignerArgs: args}); err != nil {
		return p, err
	}
	for i := 1; i <= max(opts.Assigners, 1); i++ {
		if _, err := p.assigners.StartAssigner(ctx, fmt.Sprintf("a%d", i)); err != nil {
			return p, err
		}
	}
	return p, nil
}

// writeTargets writes targets as the assigners' --targets file, Dir/targets.yaml, and
// returns its path.
func writeTargets(dir string, targets map[string]registry.Config) (string, error) {
	path := filepath.Join(dir, "targets.yaml")
	if err := os.WriteFile(path, registry.MarshalFile(targets), 0o644); err != nil {
		return "", fmt.Errorf("kvcluster: %w", err)
	}
	return path, nil
}

// Etcd returns the endpoints of the plane's etcd.
func (p *Plane) Etcd() []string { return []string{p.etcd.Endpoint()} }

// Assigners returns the plane's assigners.
func (p *Plane) Assigners() []*Member { return p.assigners.Members("assigner") }

// Exited returns the error of every assigner whose process exited without being asked to.
func (p *Plane) Exited() error { return p.assigners.Exited() }

// Stop stops the assigners, each within grace, then etcd; a second Stop does nothing. Stop
// the clusters that share the plane first: their processes stop through it (drains move
// slices in passes).
func (p *Plane) Stop(grace time.Duration) error {
	var err error
	p.stopped.Do(func() {
		if p.assigners != nil {
			err = p.assigners.Stop(grace)
		}
		p.etcd.Close()
	})
	return err
}
