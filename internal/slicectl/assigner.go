package slicectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/target"
)

// Errors of the commands that talk to an assigner.
var (
	// ErrRefused is wrapped by the error of a call the assigner refused (an unknown node, a
	// slice that does not exist, a change that is not possible now): nothing changed.
	ErrRefused = errors.New("refused")
	// ErrUnreachable is wrapped by the error of a command that found no leading assigner
	// within --timeout.
	ErrUnreachable = errors.New("unreachable")
)

// userMetadata is the gRPC metadata key that tells the assigner who makes an admin call, for
// its log (assigner.UserMetadata; not imported, to keep the server out of this binary).
const userMetadata = "x-sliceplane-user"

// session is a connection to the leading assigner, for one command.
type session struct {
	g       *globalOptions
	admin   pb.AdminServiceClient
	assign  pb.AssignmentServiceClient
	quanta  pb.QuantaServiceClient
	targets pb.TargetServiceClient
	out     *printer
	errOut  io.Writer
	// parent is the command's context: unlike the ctx a command runs with, it is not bounded
	// by --timeout, for the parts that wait longer (drain, quanta --follow).
	parent context.Context
}

// target names the target the session acts on.
func (s *session) target() string {
	if s.g == nil {
		return target.Default
	}
	return target.Name(s.g.target)
}

// withAssigner connects to the leading assigner and runs fn within --timeout, then turns the
// error into one an operator can act on.
func (g *globalOptions) withAssigner(cmd *cobra.Command, fn func(ctx context.Context, s *session) error) error {
	if err := g.check(outputs); err != nil {
		return usageError(err)
	}
	if err := g.checkAssigners(); err != nil {
		return usageError(err)
	}
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, g.timeout)
	defer cancel()
	conn, err := g.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	s := &session{
		g: g, admin: pb.NewAdminServiceClient(conn), assign: pb.NewAssignmentServiceClient(conn),
		quanta: pb.NewQuantaServiceClient(conn), targets: pb.NewTargetServiceClient(conn), out: newPrinter(cmd.OutOrStdout(), g.output),
		errOut: cmd.ErrOrStderr(), parent: parent,
	}
	return commandRefused(cmd, g.explain(parent, fn(ctx, s)))
}

// commandRefused names the command in a refusal for who slicectl is ("drain: permission
// denied: ..."): the server's message names only the RPC.
func commandRefused(cmd *cobra.Command, err error) error {
	if errors.Is(err, ErrPermission) || errors.Is(err, ErrUnauthenticated) {
		return fmt.Errorf("%s: %w", strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" "), err)
	}
	return err
}

// dial returns a connection to the leading assigner. Every call waits for a leader (within
// its context): during an election, or while a standby is being promoted, the command then
// waits rather than fails.
func (g *globalOptions) dial() (*grpc.ClientConn, error) {
	src, err := g.loadTLS()
	if err != nil {
		return nil, err
	}
	opts := append([]grpc.DialOption{
		src.DialOption("assigner"),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)),
		grpc.WithUserAgent("slicectl"),
	}, dial.WithMetadata(userMetadata, caller())...)
	conn, err := dial.TargetLeader(g.target, g.assigners, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to the assigner: %w", err)
	}
	return conn, nil
}

// caller names who runs slicectl, for the assigner's log of admin changes.
func caller() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "unknown"
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		name += "@" + host
	}
	return name + " (slicectl)"
}

// explain turns the error of a call into what an operator needs: a refusal with the
// assigner's reason, an unreachable assigner, an interrupted command. Other errors the
// assigner returned are shown as their message.
func (g *globalOptions) explain(parent context.Context, err error) error {
	if err == nil {
		return nil
	}
	if parent.Err() != nil { // interrupted: let main see context.Canceled
		return fmt.Errorf("interrupted: %w", parent.Err())
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.AlreadyExists,
		codes.OutOfRange:
		return fmt.Errorf("%w: %s", ErrRefused, strings.TrimPrefix(msg, "assigner: "))
	case codes.PermissionDenied, codes.Unauthenticated:
		return refusal(st.Code().String(), strings.TrimPrefix(msg, "assigner: "))
	case codes.Unavailable, codes.DeadlineExceeded:
		if err := refusalIn(msg); err != nil {
			return err
		}
		if cause, ok := connectionError(msg); ok {
			return g.unreachable(cause)
		}
		if st.Code() == codes.DeadlineExceeded {
			return fmt.Errorf("the assigner gave no answer within --timeout %s", g.timeout)
		}
	case codes.Canceled:
		return fmt.Errorf("interrupted: %w", context.Canceled)
	}
	return errors.New(msg)
}

// connectionError reports whether a status message is the client's own (no connection to a
// leader was ready in time) rather than the assigner's, and returns its cause.
func connectionError(msg string) (string, bool) {
	const balancer = "latest balancer error: "
	switch {
	case strings.HasPrefix(msg, balancer):
		msg = strings.TrimPrefix(msg, balancer)
	case strings.Contains(msg, "while waiting for connections to become ready"):
		return "no connection was made", true
	default:
		return "", false
	}
	// grpc writes `connection error: desc = "transport: Error while dialing: dial tcp ...: connect:
	// connection refused"`; the part that says what happened is the last one.
	if _, desc, ok := strings.Cut(msg, "desc = "); ok {
		msg = strings.Trim(desc, `"`)
	}
	msg = strings.TrimPrefix(msg, "transport: ")
	msg = strings.TrimPrefix(msg, "Error while dialing: ")
	msg = strings.TrimPrefix(msg, "error while dialing: ")
	return msg, true
}

// unreachable describes a failure to reach a leading assigner. When the assigners answer but
// none of them leads, it asks them (briefly, past --timeout) where the leader is.
func (g *globalOptions) unreachable(cause string) error {
	addrs := strings.Join(g.assigners, ",")
	within := fmt.Sprintf("(gave up after --timeout %s)", g.timeout)
	if advice := g.tlsMismatch(cause); advice != "" {
		return fmt.Errorf("%s (%s; gave up after --timeout %s)", advice, cause, g.timeout)
	}
	if strings.Contains(cause, "health check") {
		hint := leaderHint(g.assigners, g.tlsSource.DialOption("assigner"))
		if len(g.assigners) == 1 {
			return fmt.Errorf("assigner %s %w as the leader: it answers, but does not lead %s%s", addrs, ErrUnreachable, within, hint)
		}
		return fmt.Errorf("assigners %s %w as the leader: they answer, but none leads %s%s", addrs, ErrUnreachable, within, hint)
	}
	if len(g.assigners) == 1 {
		return fmt.Errorf("assigner %s %w: %s %s", addrs, ErrUnreachable, cause, within)
	}
	return fmt.Errorf("assigners %s %w: %s %s", addrs, ErrUnreachable, cause, within)
}

// leaderHint asks each assigner directly (a standby answers Status too) where the leader is,
// and returns advice, or nothing if none knows.
func leaderHint(addrs []string, creds grpc.DialOption) string {
	for _, a := range addrs {
		if leader := askLeader(a, creds); leader != "" {
			return fmt.Sprintf("; %s says the leader is at %s: give that address with --assigner", a, leader)
		}
	}
	return "; no leader is known yet: an election may be under way, try again"
}

func askLeader(addr string, creds grpc.DialOption) string {
	conn, err := grpc.NewClient(strings.TrimSpace(addr), creds)
	if err != nil {
		return ""
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := pb.NewAdminServiceClient(conn).Status(ctx, &pb.StatusRequest{})
	if err != nil || st.GetLeader() {
		return ""
	}
	return st.GetLeaderAddress()
}

// sliceRefHelp says how to write a SLICE argument.
const sliceRefHelp = "want a slice's start (0x-prefixed hex or decimal), key:TEXT or hash:POINT"

// parseSliceRef reads a SLICE argument: a slice's start, key:TEXT or hash:POINT.
func parseSliceRef(arg string) (*pb.SliceRef, error) {
	if key, ok := strings.CutPrefix(arg, "key:"); ok {
		if key == "" {
			return nil, fmt.Errorf("SLICE %q: the key is empty", arg)
		}
		return &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: []byte(key)}}, nil
	}
	if h, ok := strings.CutPrefix(arg, "hash:"); ok {
		p, err := keyspace.ParsePoint(h)
		if err != nil {
			return nil, fmt.Errorf("SLICE %q: the hash: %w", arg, err)
		}
		return &pb.SliceRef{Ref: &pb.SliceRef_Hash{Hash: p}}, nil
	}
	p, err := keyspace.ParsePoint(arg)
	if err != nil {
		return nil, fmt.Errorf("SLICE %q: %s", arg, sliceRefHelp)
	}
	return &pb.SliceRef{Ref: &pb.SliceRef_Start{Start: p}}, nil
}

// sliceArgs checks the count of SLICE arguments and parses them, as usage errors.
func sliceArgs(names ...string) cobra.PositionalArgs {
	check := positional(names...)(len(names))
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return err
		}
		for _, a := range args {
			if _, err := parseSliceRef(a); err != nil {
				return usageError(err)
			}
		}
		return nil
	}
}

// mustSliceRef parses an argument that sliceArgs has checked.
func mustSliceRef(arg string) *pb.SliceRef {
	r, err := parseSliceRef(arg)
	if err != nil {
		panic(err) // sliceArgs checked it
	}
	return r
}

// completeNodes completes node IDs from the assigner, within a short time.
func (g *globalOptions) completeNodes(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if g.checkAssigners() != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	conn, err := g.dial()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer conn.Close()
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, min(g.timeout, 2*time.Second))
	defer cancel()
	resp, err := pb.NewAdminServiceClient(conn).ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var ids []cobra.Completion
	for _, n := range resp.GetNodes() {
		ids = append(ids, n.GetNode().GetId())
	}
	return ids, cobra.ShellCompDirectiveNoFileComp
}

// nodeArgCompletion completes the first argument with node IDs, and nothing after it.
func (g *globalOptions) nodeArgCompletion(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return g.completeNodes(cmd, args, toComplete)
}
