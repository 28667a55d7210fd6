package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/client"
	ratelimitv1 "github.com/sliceplane/sliceplane/examples/ratelimit/proto/ratelimit/v1"
)

func takeCommand(o *options) *cobra.Command {
	var tokens uint32
	cmd := &cobra.Command{
		Use:   "take KEY",
		Short: "Take tokens from KEY's bucket, all or none, on the key's primary",
		Args:  oneKey,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.call(cmd.Context(), cmd.OutOrStdout(), args[0], func(ctx context.Context, c ratelimitv1.RateLimitServiceClient) (answer, error) {
				resp, err := c.Take(client.WithWriteKey(ctx, []byte(args[0])), &ratelimitv1.TakeRequest{Key: args[0], Tokens: tokens})
				allowed := resp.GetAllowed()
				return answer{Key: args[0], Allowed: &allowed, Remaining: resp.GetRemaining(), Member: resp.GetMember()}, err
			})
		},
	}
	cmd.Flags().Uint32Var(&tokens, "tokens", 1, "tokens to take")
	return cmd
}
