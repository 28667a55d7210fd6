package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/client"
	ratelimitv1 "github.com/sliceplane/sliceplane/examples/ratelimit/proto/ratelimit/v1"
)

func peekCommand(o *options) *cobra.Command {
	var primary bool
	cmd := &cobra.Command{
		Use:   "peek KEY",
		Short: "Say how many tokens KEY's bucket holds, taking none",
		Long: `peek asks one replica of KEY's range how many tokens KEY's bucket holds. Only
the key's primary takes from the bucket, and members do not copy buckets to one
another: a secondary answers a full bucket. --primary asks the primary.`,
		Args: oneKey,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.call(cmd.Context(), cmd.OutOrStdout(), args[0], func(ctx context.Context, c ratelimitv1.RateLimitServiceClient) (answer, error) {
				withKey := client.WithKey
				if primary { // routed as a write is, though it writes nothing
					withKey = client.WithWriteKey
				}
				ctx = withKey(ctx, []byte(args[0]))
				resp, err := c.Peek(ctx, &ratelimitv1.PeekRequest{Key: args[0]})
				return answer{Key: args[0], Remaining: resp.GetRemaining(), Member: resp.GetMember()}, err
			})
		},
	}
	cmd.Flags().BoolVar(&primary, "primary", false, "ask the key's primary, whose bucket takes count against")
	return cmd
}
