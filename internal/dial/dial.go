// Package dial connects to the assigner's leader. Assigners run as a leader and standbys;
// only the leader streams quanta and takes registrations. A connection given every
// assigner's address sends each call to the one whose health service reports
// "sliceplane.leader" as serving, and follows a failover by itself.
//
// It also holds the liveness parameters of every gRPC connection in Sliceplane (keepalive,
// connection timeouts, the heartbeats of long-lived streams), so that clients and servers
// agree on them.
package dial

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/internal/target"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health" // client-side health checking, which finds the leader
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// LeaderHealthService is the health service name that only the default target's leading
// assigner serves; another target's is target.LeaderHealthService(name).
const LeaderHealthService = target.DefaultLeaderHealth

// Liveness parameters. A peer that hangs (SIGSTOP, a stalled link) keeps its TCP connection
// open: without keepalive a stream to it stays "open" forever.
const (
	// KeepaliveTime is how long a client's transport may be silent before it pings. gRPC
	// will not ping more often than every 10 s, so streams also carry heartbeats of their own
	// (StreamHeartbeat), which notice a hung peer faster.
	KeepaliveTime = 10 * time.Second
	// KeepaliveTimeout is how long a ping may go unanswered before the transport is closed.
	KeepaliveTimeout = 3 * time.Second
	// ServerKeepaliveTime is how long a client may send a server nothing before the server
	// pings it, so that a server frees the streams of a client that hung. A watcher sends
	// nothing after its request, so a relay pings each of its routers' connections (the one
	// watched, the one ready for a move) this often: at 5 s, that was as many messages as
	// all the heartbeats of an idle fleet.
	ServerKeepaliveTime = 20 * time.Second
	// ServerKeepaliveTimeout is how long a server waits for a client's answer to its ping. It
	// is long: a server only frees resources with it, and nothing waits on it, while a client
	// process whose cores are saturated answers late. At 3 s, a relay's kill under 6,000
	// routers packed in two processes had the other relays close 3,800 healthy connections.
	ServerKeepaliveTimeout = 20 * time.Second
	// LeaderIdleTimeout is how long a connection to the assigners (Leader) stays open with no
	// call in flight. A router that watches a relay uses it only if every relay fails: held
	// open, ten thousand routers would hold twenty thousand connections and health watches
	// on the assigners, which the relay tier is there to spare them. gRPC's default is 30
	// minutes.
	LeaderIdleTimeout = 5 * time.Second
	// ConnectTimeout bounds a connection attempt, TCP and the HTTP/2 handshake: a frozen peer
	// accepts TCP (the kernel does) and never answers.
	ConnectTimeout = 3 * time.Second
	// StreamHeartbeat is the longest a server leaves a long-lived stream (the quanta and
	// assignment watches, a node's pull) without a message: idle is then told from dead.
	StreamHeartbeat = 500 * time.Millisecond
	// StreamIdleTimeout is how long a watcher waits on a silent stream before it drops the
	// connection and reconnects to whoever leads now: several missed heartbeats.
	StreamIdleTimeout = 4 * StreamHeartbeat
	// MaxStreamHeartbeat is the longest heartbeat interval a watcher may ask of a server
	// (WatchAssignmentRequest.heartbeat).
	MaxStreamHeartbeat = 5 * time.Second
)

// Flow-control windows, fixed. gRPC sizes its windows by estimating the link's bandwidth-delay
// product, and to do so answers a data frame with a ping and a window update whenever no
// estimate is in flight: every heartbeat, on a watch that is mostly heartbeats, cost three
// frames and two more system calls each side. A router process followed its watches at
// twice the CPU. Fixed windows end the estimate; these are as large as the estimate grows on
// a fast link, so a map's snapshot still streams at the link's speed.
const (
	StreamWindow = 4 << 20
	ConnWindow   = 16 << 20
)

// Options returns the dial options of every Sliceplane client connection: plaintext,
// keepalive, and bounded connection attempts.
func Options() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: KeepaliveTime, Timeout: KeepaliveTimeout, PermitWithoutStream: true,
		}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: ConnectTimeout,
		}),
		grpc.WithInitialWindowSize(StreamWindow),
		grpc.WithInitialConnWindowSize(ConnWindow),
	}
}

// ServerOptions returns the keepalive options of every Sliceplane gRPC server: it pings
// silent clients, and accepts the pings Options' clients send (a server that thinks a
// client pings too often closes its connection).
func ServerOptions() []grpc.ServerOption {
	return serverOptions(ServerKeepaliveTime, ServerKeepaliveTimeout)
}

// serverOptions returns ServerOptions with a server that pings a client silent for ping and
// waits wait for its answer.
func serverOptions(ping, wait time.Duration) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveTime / 2, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: ping, Timeout: wait}),
		grpc.InitialWindowSize(StreamWindow),
		grpc.InitialConnWindowSize(ConnWindow),
	}
}

// Peer returns a connection to one address, with Options.
func Peer(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, append(Options(), opts...)...)
	if err != nil {
		return nil, fmt.Errorf("dial: %s: %w", addr, err)
	}
	return conn, nil
}

// Leader returns a connection to whichever of the assigners at addrs leads. Calls made while
// no assigner leads fail with UNAVAILABLE, or wait with grpc.WaitForReady.
//
// It holds a transport and a health watch to every assigner while it is in use, and closes
// them after LeaderIdleTimeout without a call in flight; the next call connects again.
//
// A leader that hangs keeps its last health status, SERVING, until keepalive closes its
// transport; callers that notice it sooner (a silent stream, a call that timed out) replace
// the connection: see Follower.
func Leader(addrs []string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return TargetLeader("", addrs, opts...)
}

// TargetLeader is Leader for target name ("" the default target): its connection reaches
// the assigner that leads the target, and every call on it names the target.
func TargetLeader(name string, addrs []string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	var clean []resolver.Address
	for _, a := range addrs {
		if a = strings.TrimSpace(a); a != "" {
			clean = append(clean, resolver.Address{Addr: a})
		}
	}
	if len(clean) == 0 {
		return nil, errors.New("dial: no assigner address")
	}
	r := manual.NewBuilderWithScheme("sliceplane-assigners")
	r.InitialState(resolver.State{Addresses: clean})
	config := fmt.Sprintf(`{"loadBalancingConfig":[{"round_robin":{}}],"healthCheckConfig":{"serviceName":%q}}`, target.LeaderHealthService(name))
	opts = append(append(append(Options(), Target(name)...),
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(config),
		grpc.WithIdleTimeout(LeaderIdleTimeout),
	), opts...)
	conn, err := grpc.NewClient(r.Scheme()+":///assigners", opts...)
	if err != nil {
		return nil, fmt.Errorf("dial: the assigners at %v: %w", addrs, err)
	}
	return conn, nil
}

// Target returns the options of a connection whose calls all name target name in their
// metadata (target.MetadataKey); none for the default target, whose calls name none, as
// before targets.
func Target(name string) []grpc.DialOption {
	if target.Name(name) == target.Default {
		return nil
	}
	return WithMetadata(target.MetadataKey, name)
}

// WithMetadata returns the options of a connection that adds key: value to the outgoing
// metadata of every call, unary and streaming.
func WithMetadata(key, value string) []grpc.DialOption {
	with := func(ctx context.Context) context.Context {
		return metadata.AppendToOutgoingContext(ctx, key, value)
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(with(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(with(ctx), desc, cc, method, opts...)
		}),
	}
}
