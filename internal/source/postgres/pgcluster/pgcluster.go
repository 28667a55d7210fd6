// Package pgcluster runs a throwaway PostgreSQL server in a directory, on a free loopback
// port, set up for logical replication: for the tests, the end-to-end run and the demo of
// the PostgreSQL source. It needs the server's binaries (initdb, pg_ctl; Debian's
// postgresql package) and, when run as root, the postgres OS user, since PostgreSQL refuses
// to run as root.
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
	"time"
)

// ErrNoServer says that no PostgreSQL binaries were found.
var ErrNoServer = errors.New("pgcluster: no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql/*/bin; install Debian's postgresql package")

// Cluster is a running throwaway server.
type Cluster struct {
	// DSN connects to its database "sliceplane" as the superuser "sliceplane", on loopback,
	// without a password (trust), with TLS off.
	DSN string
	// Dir holds the data directory (Dir/data) and the server's log (Dir/postgres.log).
	Dir  string
	Port int

	bin  string
	as   []string // the command prefix that runs a binary as the server's OS user
	data string
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
	if len(c.as) == 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(path, uid, gid); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// start starts the server on c.Port with settings, and waits until it accepts connections.
func (c *Cluster) start(ctx context.Context, extra map[string]string) error {
	settings := map[string]string{
		"listen_addresses": "127.0.0.1", "port": strconv.Itoa(c.Port), "unix_socket_directories": "''",
		"wal_level": "logical", "max_replication_slots": "32", "max_wal_senders": "32",
		// A throwaway server: speed over durability.
		"fsync": "off", "full_page_writes": "off",
	}
	for k, v := range extra {
		settings[k] = v
	}
	var opts []string
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		opts = append(opts, "-c "+k+"="+settings[k])
	}
	return c.run(ctx, "pg_ctl", "-D", c.data, "-l", filepath.Join(c.Dir, "postgres.log"), "-w", "-t", "60",
		"-o", strings.Join(opts, " "), "start")
}

// Stop stops the server at once (its data is throwaway) and waits for it.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.run(ctx, "pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop")
}

// Restart restarts the server with pg_ctl's shutdown mode ("fast", as a minor-version
// upgrade does; "immediate", as a crash does; "smart") and waits until it accepts
// connections again, on the same port and with the same settings.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	return c.run(ctx, "pg_ctl", "-D", c.data, "-l", filepath.Join(c.Dir, "postgres.log"), "-m", mode, "-w", "-t", "60", "restart")
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
	argv := append(append(slices.Clone(c.as), filepath.Join(c.bin, name)), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = c.Dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: %s: %w\n%s%s", name, err, out, c.Log())
	}
	return nil
}

// binDir finds the directory of initdb and pg_ctl: PATH first (Debian puts only psql
// there), then the newest /usr/lib/postgresql/N/bin.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
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

// runAs returns the prefix that runs the server's binaries: none for an ordinary user;
// for root, runuser as the postgres OS user, who is then given dir.
func runAs(dir string) ([]string, error) {
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
	runuser, err := exec.LookPath("runuser")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root needs runuser: %w", err)
	}
	return []string{runuser, "-u", "postgres", "--"}, nil
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
