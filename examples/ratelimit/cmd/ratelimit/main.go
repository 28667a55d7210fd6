// Command ratelimit takes tokens from, and peeks at, the buckets of the example rate limiter.
// See ratelimit --help.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/client"
	ratelimitv1 "github.com/sliceplane/sliceplane/examples/ratelimit/proto/ratelimit/v1"
	"github.com/sliceplane/sliceplane/internal/cli"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

func main() { cli.Main("ratelimit", command().ExecuteContext) }

// options are the flags every subcommand shares.
type options struct {
	assigners []string
	tls       mtls.Config
	output    string
	timeout   time.Duration
}

func command() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "ratelimit",
		Short: "Take tokens from the example rate limiter's buckets, or peek at them",
		Long: `ratelimit calls the example rate limiter (ratelimitmember): it follows the
assigners' map with a Sliceplane router and sends each call to the member that
serves its key, a take to the key's primary, a peek to any of its replicas. A
call a member refuses because the key moved is sent again where the map says,
until --timeout.

With --tls-cert, --tls-key and --tls-ca (a router's certificate,
spiffe://sliceplane/router/NAME) it dials the assigners and the members with
mutual TLS, and expects the members to be nodes of the same CA.`,
		Example: `  ratelimit take visits                 # allowed: 19.0 tokens left (member r1)
  ratelimit take visits --tokens 5 -o json
  ratelimit peek visits
  ratelimit take visits --tls-cert certs/router-cli.crt --tls-key certs/router-cli.key --tls-ca certs/ca.crt`,
		SilenceUsage: true, SilenceErrors: true,
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })
	f := cmd.PersistentFlags()
	f.StringSliceVar(&o.assigners, "assigners", []string{"127.0.0.1:7070"}, "gRPC addresses of the assigners")
	o.tls.AddFlags(f, false)
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	f.DurationVar(&o.timeout, "timeout", 10*time.Second, "how long to wait for the map and an answer")
	cmd.AddCommand(takeCommand(o), peekCommand(o))
	return cmd
}

// usage marks err as an error in how the command was called (exit status 2).
func usage(err error) error { return fmt.Errorf("%w: %w", cli.ErrUsage, err) }

// oneKey accepts one non-empty argument, the key.
func oneKey(_ *cobra.Command, args []string) error {
	if len(args) != 1 || args[0] == "" {
		return usage(errors.New("want one KEY, not empty"))
	}
	return nil
}

// answer is what a call printed: Allowed is nil for a peek.
type answer struct {
	Key       string  `json:"key"`
	Allowed   *bool   `json:"allowed,omitempty"`
	Remaining float64 `json:"remaining"`
	Member    string  `json:"member"`
}

// call runs fn against the members through a router of the assigners, within --timeout,
// and prints its answer.
func (o *options) call(ctx context.Context, w io.Writer, key string, fn func(context.Context, ratelimitv1.RateLimitServiceClient) (answer, error)) error {
	if o.output != "text" && o.output != "json" {
		return usage(fmt.Errorf("--output %q: want text or json", o.output))
	}
	tls := client.TLS{Cert: o.tls.Cert, Key: o.tls.Key, CA: o.tls.CA}
	creds, err := tls.MemberDialOption() // the members' certificates name them as nodes
	if err != nil {
		return usage(err)
	}
	r, err := client.NewRouter(client.RouterConfig{Assigners: o.assigners, TLS: tls})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	routing, stopRouter := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(routing) //nolint:errcheck // nil once routing ends
	}()
	defer func() { stopRouter(); <-done }()
	if err := r.WaitReady(ctx); err != nil {
		return fmt.Errorf("no map from the assigners %v within %s (is an assigner running there, and has a member registered?): %w", o.assigners, o.timeout, err)
	}
	conn, err := grpc.NewClient("sliceplane:///ratelimit", append(client.GRPCDialOptions(r), creds)...)
	if err != nil {
		return err
	}
	defer conn.Close()
	a, err := fn(ctx, ratelimitv1.NewRateLimitServiceClient(conn))
	if err != nil {
		return explain(r, key, err)
	}
	return a.print(w, o.output)
}

// explain makes a failed call's error say what the map gives its key when the call could
// not reach a member: the client's own error speaks of a deadline or a connection.
func explain(r *client.Router, key string, err error) error {
	st := status.Convert(err)
	err = fmt.Errorf("%s: %s", st.Code(), st.Message())
	if st.Code() != codes.DeadlineExceeded && st.Code() != codes.Unavailable {
		return err
	}
	route, lerr := r.Lookup([]byte(key))
	if lerr != nil {
		return err
	}
	var held []string
	for _, rep := range route.Replicas {
		at := rep.Address
		if at == "" {
			at = "no address known: not registered now"
		}
		held = append(held, fmt.Sprintf("%s as %s (%s)", rep.ID, rep.Role, at))
	}
	if len(held) == 0 {
		return fmt.Errorf("%w; no member holds the key in the map: is a ratelimitmember running?", err)
	}
	return fmt.Errorf("%w; the map gives the key to %s", err, strings.Join(held, ", "))
}

func (a answer) print(w io.Writer, format string) error {
	a.Remaining = math.Round(a.Remaining*1000) / 1000 // a bucket refills between any two looks
	if format == "json" {
		return json.NewEncoder(w).Encode(a)
	}
	var err error
	switch {
	case a.Allowed == nil:
		_, err = fmt.Fprintf(w, "%.1f tokens (member %s)\n", a.Remaining, a.Member)
	case *a.Allowed:
		_, err = fmt.Fprintf(w, "allowed: %.1f tokens left (member %s)\n", a.Remaining, a.Member)
	default:
		_, err = fmt.Fprintf(w, "refused: %.1f tokens left (member %s)\n", a.Remaining, a.Member)
	}
	return err
}
