package assigner_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // the child serves profiles
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// The scale benchmark runs the assigner in a child process, this test binary re-executed with
// childEnv set, so that its CPU is measured apart from the load generator's. With mutual TLS
// the child's certificate files are named by the other three variables.
const (
	childEnv     = "SLICEPLANE_SCALE_ASSIGNER"
	childNodes   = "SLICEPLANE_SCALE_NODES" // the first map waits for them, 150k slices over them
	childCertEnv = "SLICEPLANE_SCALE_TLS_CERT"
	childKeyEnv  = "SLICEPLANE_SCALE_TLS_KEY"
	childCAEnv   = "SLICEPLANE_SCALE_TLS_CA"
)

// runChild runs an assigner on a durable embedded etcd in the directory named by childEnv,
// both over mutual TLS if the TLS variables are set, writes its address to addr.txt there,
// and serves until SIGTERM. It logs JSON at debug level to stderr, where the parent reads
// each pass's duration.
func runChild() {
	dir := os.Getenv(childEnv)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	files := mtls.Config{Cert: os.Getenv(childCertEnv), Key: os.Getenv(childKeyEnv), CA: os.Getenv(childCAEnv)}
	src, err := files.Load()
	if err != nil {
		log.Error("tls", "err", err)
		os.Exit(1)
	}
	// The embedded etcd serves with the assigner's certificate, as the assigner command does.
	etcd, err := embedetcd.Start(ctx, embedetcd.Options{Dir: filepath.Join(dir, "etcd"), Logger: log, TLS: files})
	if err != nil {
		log.Error("etcd", "err", err)
		os.Exit(1)
	}
	defer etcd.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, Logger: zap.NewNop(), TLS: src.ClientTLS()})
	if err != nil {
		os.Exit(1)
	}
	defer cli.Close()
	nodes, err := strconv.Atoi(os.Getenv(childNodes))
	if err != nil || nodes <= 0 {
		log.Error("nodes", "err", err, "nodes", nodes)
		os.Exit(1)
	}
	perNode := 150_000 / nodes
	params := map[string]string{"initial_slices_per_node": strconv.Itoa(perNode), "min_slices_per_node": strconv.Itoa(min(50, perNode))}
	srv, err := assigner.New(assigner.Config{
		Client: cli, Logger: log, PassInterval: time.Second, TLS: src,
		// A long lease: setting up 100 watchers of a 150k-slice map takes a while, and the
		// nodes only start reporting after it.
		Core: core.Config{NodeTTL: 10 * time.Minute, FirstMapNodes: nodes, Params: params},
	})
	if err != nil {
		log.Error("assigner", "err", err)
		os.Exit(1)
	}
	serveChild(ctx, log, dir, srv, etcd.Endpoint())
}

// serveChild tells the parent where the child serves, then serves until ctx ends.
func serveChild(ctx context.Context, log *slog.Logger, dir string, srv *assigner.Server, etcd string) {
	if lis, err := net.Listen("tcp", "127.0.0.1:0"); err == nil { // pprof, for profiling the benchmark
		go http.Serve(lis, nil)
		os.WriteFile(filepath.Join(dir, "pprof.txt"), []byte(lis.Addr().String()), 0o644)
	}
	if err := os.WriteFile(filepath.Join(dir, "etcd.txt"), []byte(etcd), 0o644); err != nil {
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(dir, "addr.txt"), []byte(srv.Addr()), 0o644); err != nil {
		os.Exit(1)
	}
	if err := srv.Run(ctx); err != nil {
		log.Error("run", "err", err)
	}
}

// assignerProc is the child process, seen from the benchmark: the passes its log reports.
type assignerProc struct {
	child   *launch.Child
	dir     string
	logDone chan struct{}

	mu sync.Mutex
	// whole passes; their computation, before persistence; their writes; their commit
	// steps (ms)
	passes, computes, writes, commits []float64
}

// startAssigner starts the child in dir with the extra environment env; stop ends it.
func startAssigner(b *testing.B, dir string, env []string) *assignerProc {
	p := &assignerProc{dir: dir, logDone: make(chan struct{})}
	p.child = startChild(b, append([]string{childEnv + "=" + dir}, env...), func(r io.Reader) { p.readLog(b, r) })
	return p
}

// startChild runs this test binary again as a child with the extra environment env, and
// read on its standard error until it ends.
func startChild(b *testing.B, env []string, read func(io.Reader)) *launch.Child {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	// A pipe of our own, not StderrPipe: the child's wait (launch's) must not close it
	// before its last lines are read.
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = w
	child, err := launch.StartChild(cmd)
	w.Close()
	if err != nil {
		r.Close()
		b.Fatal(err)
	}
	go func() {
		defer r.Close()
		read(r)
	}()
	return child
}

// readLog collects the passes' durations and passes on warnings, errors and leadership.
func (p *assignerProc) readLog(b *testing.B, r io.Reader) {
	defer close(p.logDone)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var line struct {
			Msg       string `json:"msg"`
			Took      int64  `json:"took"`
			Computed  int64  `json:"computed"`
			Wrote     int64  `json:"wrote"`
			Committed int64  `json:"committed"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch {
		case line.Msg == "pass":
			p.mu.Lock()
			p.passes = append(p.passes, float64(line.Took)/1e6)
			p.computes = append(p.computes, float64(line.Computed)/1e6)
			p.writes = append(p.writes, float64(line.Wrote)/1e6)
			p.commits = append(p.commits, float64(line.Committed)/1e6)
			p.mu.Unlock()
		case strings.Contains(sc.Text(), `"level":"WARN"`) || strings.Contains(sc.Text(), `"level":"ERROR"`) ||
			strings.Contains(line.Msg, "leading"):
			b.Log("assigner: " + sc.Text())
		}
	}
}

func (p *assignerProc) stop() {
	p.child.Signal(syscall.SIGTERM)
	p.child.Wait()
	<-p.logDone
}

// file waits until the child has written the file name in its directory, and returns it.
func (p *assignerProc) file(b *testing.B, name string, deadline time.Time) string {
	return childFile(b, p.dir, name, deadline)
}

// childFile waits until a child has written the file name in its directory dir, and
// returns it.
func childFile(b *testing.B, dir, name string, deadline time.Time) string {
	for {
		if data, _ := os.ReadFile(filepath.Join(dir, name)); len(data) > 0 {
			return string(data)
		}
		if time.Now().After(deadline) {
			b.Fatalf("the assigner did not write %s", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cpu returns the CPU time the child has used, in seconds.
func (p *assignerProc) cpu(b *testing.B) float64 {
	s, err := launch.CPUSeconds(p.child.Pid())
	if err != nil {
		b.Fatal(err)
	}
	return s
}
