// Package pgcluster runs a throwaway PostgreSQL server in a directory, on a free loopback
// port, set up for logical replication: for the tests, the end-to-end run and the demo of
// the PostgreSQL source. It needs the server's binaries (initdb, postgres; Debian's
// postgresql package) and, when run as root, the postgres OS user, since PostgreSQL refuses
// to run as root.
//
// The server runs in the foreground, a child of this process, not daemonized by pg_ctl:
// the kernel kills it when this process dies (launch.StartChild), and its own processes
// exit once it has. A test killed from outside leaves no server behind.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sliceplane/sliceplane/internal/launch"
)

// ErrNoServer says that no PostgreSQL binaries were found.
var ErrNoServer = errors.New("pgcluster: no PostgreSQL server binaries (initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin; install Debian's postgresql package")

// Cluster is a running throwaway server.
type Cluster struct {
	// DSN connects to its database "sliceplane" as the superuser "sliceplane", on loopback,
	// without a password (trust), with TLS off.
	DSN string
	// Dir holds the data directory (Dir/data) and the server's log (Dir/postgres.log).
	Dir  string
	Port int

	bin  string
	as   *syscall.Credential // the server's OS user, when this process runs as root
	data string
	args []string // the server's command line, but its binary

	mu     sync.Mutex
	server *launch.Child // nil once stopped
}

// Options shape a cluster.
type Options struct {
	// Settings are extra server settings (name → value), after the ones logical
	// replication needs (wal_level=logical and enough slots and senders).
	Settings map[string]string
	// CertFile and KeyFile, when set, turn TLS on with that certificate (clients may still
	// connect without it: sslmode says what a client insists on).
	CertFile, KeyFile string
}

// Installed returns ErrNoServer where no server binaries are found, nil otherwise.
func Installed() error {
	_, err := binDir()
	return err
}

// Start initializes a cluster in dir (which it creates), starts it and creates the database.
// Stop it with Stop.
func Start(ctx context.Context, dir string, opts Options) (*Cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, bin: bin, data: filepath.Join(dir, "data")}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if c.as, err = runAs(dir); err != nil {
		return nil, err
	}
	if err := c.run(ctx, "initdb", "-D", c.data, "-U", "sliceplane", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		return nil, err
	}
	if c.Port, err = freePort(); err != nil {
		return nil, err
	}
	settings, err := c.tls(opts)
	if err != nil {
		return nil, err
	}
	if err := c.start(ctx, settings); err != nil {
		return nil, err
	}
	c.DSN = fmt.Sprintf("postgres://sliceplane@127.0.0.1:%d/sliceplane?sslmode=disable", c.Port)
	if err := c.run(ctx, "createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "sliceplane", "sliceplane"); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// tls copies the certificate and key of opts into the data directory, where the server's
// user owns them (PostgreSQL refuses a key others can read), and returns the settings with
// TLS on.
func (c *Cluster) tls(opts Options) (map[string]string, error) {
	settings := maps.Clone(opts.Settings)
	if opts.CertFile == "" {
		return settings, nil
	}
	if settings == nil {
		settings = map[string]string{}
	}
	for _, f := range []struct{ from, to string }{{opts.CertFile, "server.crt"}, {opts.KeyFile, "server.key"}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		to := filepath.Join(c.data, f.to)
		if err := os.WriteFile(to, b, 0o600); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		if err := c.own(to); err != nil {
			return nil, err
		}
	}
	settings["ssl"] = "on"
	return settings, nil
}

// own gives path to the server's OS user, when the cluster runs as one.
func (c *Cluster) own(path string) error {
	if c.as == nil {
		return nil
	}
	if err := os.Chown(path, int(c.as.Uid), int(c.as.Gid)); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// start starts the server on c.Port with settings, and waits until it accepts connections.
func (c *Cluster) start(ctx context.Context, extra map[string]string) error {
	settings := map[string]string{
		"listen_addresses": "127.0.0.1", "port": strconv.Itoa(c.Port), "unix_socket_directories": "",
		"wal_level": "logical", "max_replication_slots": "32", "max_wal_senders": "32",
		// A throwaway server: speed over durability.
		"fsync": "off", "full_page_writes": "off",
	}
	for k, v := range extra {
		settings[k] = v
	}
	c.args = []string{"-D", c.data}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		c.args = append(c.args, "-c", k+"="+settings[k])
	}
	return c.serve(ctx)
}

// serve starts the server, in the foreground, and waits until it accepts connections.
func (c *Cluster) serve(ctx context.Context) error {
	log, err := os.OpenFile(filepath.Join(c.Dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), c.args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = c.Dir, log, log
	// A group of its own, as pg_ctl's server had: a Ctrl-C in a demo's terminal reaches
	// the demo, which stops the server last.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.as}
	server, err := launch.StartChild(cmd)
	log.Close() // the server has its own copy
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	c.mu.Lock()
	c.server = server
	c.mu.Unlock()
	if err := c.waitReady(ctx, server); err != nil {
		c.shutdown(syscall.SIGKILL) //nolint:errcheck // the error is the wait's
		return err
	}
	return nil
}

// readyTimeout bounds a start, as pg_ctl's -t 60 did.
const readyTimeout = time.Minute

// waitReady waits until the server says it accepts connections, as pg_ctl -w does: the
// eighth line of postmaster.pid, once the file is the server's own (its first line, its
// process ID), reads "ready".
func (c *Cluster) waitReady(ctx context.Context, server *launch.Child) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	pidFile := filepath.Join(c.data, "postmaster.pid")
	err := launch.WaitFor(ctx, "PostgreSQL to accept connections", 20*time.Millisecond, func(context.Context) error {
		select {
		case <-server.Done():
			return launch.Permanent(fmt.Errorf("the server exited: %v", server.Wait()))
		default:
		}
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		if len(lines) < 8 || strings.TrimSpace(lines[0]) != strconv.Itoa(server.Pid()) {
			return errors.New("postmaster.pid is not the server's yet")
		}
		if st := strings.TrimSpace(lines[7]); st != "ready" {
			return fmt.Errorf("the server is %q", st)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgcluster: %w\n%s", err, c.Log())
	}
	return nil
}

// stopTimeout bounds a shutdown, as pg_ctl's did.
const stopTimeout = time.Minute

// shutdown sends the server sig (SIGTERM: smart, SIGINT: fast, SIGQUIT: immediate, SIGKILL)
// and waits for it to exit; a server that has not after stopTimeout is killed.
func (c *Cluster) shutdown(sig syscall.Signal) error {
	c.mu.Lock()
	server := c.server
	c.server = nil
	c.mu.Unlock()
	if server == nil {
		return nil
	}
	server.Signal(sig) //nolint:errcheck // it may have exited already
	select {
	case <-server.Done():
		return nil
	case <-time.After(stopTimeout):
		server.Signal(syscall.SIGKILL) //nolint:errcheck // it may have exited meanwhile
		server.Wait()                  //nolint:errcheck // killed
		return fmt.Errorf("pgcluster: the server did not stop within %s on %v; killed\n%s", stopTimeout, sig, c.Log())
	}
}

// Stop stops the server at once (its data is throwaway) and waits for it; stopping a
// stopped server does nothing.
func (c *Cluster) Stop() error {
	return c.shutdown(syscall.SIGQUIT)
}

// shutdownSignals are the signals of pg_ctl's shutdown modes.
var shutdownSignals = map[string]syscall.Signal{"smart": syscall.SIGTERM, "fast": syscall.SIGINT, "immediate": syscall.SIGQUIT}

// Restart restarts the server with one of pg_ctl's shutdown modes ("fast", as a
// minor-version upgrade does; "immediate", as a crash does; "smart") and waits until it
// accepts connections again, on the same port and with the same settings.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	sig, ok := shutdownSignals[mode]
	if !ok {
		return fmt.Errorf("pgcluster: shutdown mode %q: want smart, fast or immediate", mode)
	}
	if err := c.shutdown(sig); err != nil {
		return err
	}
	return c.serve(ctx)
}

// Log returns the last lines of the server's log, for error messages.
func (c *Cluster) Log() string {
	b, err := os.ReadFile(filepath.Join(c.Dir, "postgres.log"))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// run runs one of the server's binaries as the server's OS user.
func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.as}
	out, err := launch.CombinedOutput(cmd)
	if err != nil {
		return fmt.Errorf("pgcluster: %s: %w\n%s%s", name, err, out, c.Log())
	}
	return nil
}

// binDir finds the directory of initdb and postgres: PATH first (Debian puts only psql
// there), then the newest /usr/lib/postgresql/N/bin.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	slices.SortFunc(found, func(a, b string) int { return version(b) - version(a) })
	if len(found) == 0 {
		return "", ErrNoServer
	}
	return filepath.Dir(found[0]), nil
}

// version returns the major version in a path /usr/lib/postgresql/N/bin/initdb.
func version(p string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return n
}

// runAs returns the OS user the server's binaries run as: nil, this process's, for an
// ordinary user; for root, the postgres OS user, who is then given dir. The child takes it
// as it starts (SysProcAttr.Credential), before the parent-death signal is set: a command
// that switched users itself, as runuser does, would clear that signal.
func runAs(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root, and PostgreSQL refuses to: no postgres OS user to run it as (%w)", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	// The user must reach dir: every directory above it is made traversable.
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		if err := traversable(d); err != nil {
			return nil, err
		}
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// traversable gives everyone search permission on directory d, if it lacks it, keeping its
// other bits (a sticky /tmp stays sticky).
func traversable(d string) error {
	st, err := os.Stat(d)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if st.Mode().Perm()&0o011 == 0o011 {
		return nil
	}
	if err := os.Chmod(d, st.Mode()&(os.ModePerm|os.ModeSticky|os.ModeSetgid)|0o011); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// freePort returns a loopback port no one listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
