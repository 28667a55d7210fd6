package kvcluster

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// StartEtcd starts the embedded etcd a demo's cluster keeps its state in, under dir/etcd. It
// serves https and requires a client certificate of pki's CA, which every process of the
// cluster has.
func StartEtcd(ctx context.Context, pki *launch.PKI, dir string, log *slog.Logger) (*embedetcd.Server, error) {
	tls, err := pki.Issue("etcd", "demo")
	if err != nil {
		return nil, err
	}
	// etcd reports a single-member loopback setup as errors; a demo has nothing to fix.
	return embedetcd.Start(ctx, embedetcd.Options{Dir: filepath.Join(dir, "etcd"), Fast: true, TLS: tls,
		LogLevel: "fatal", Logger: log})
}
