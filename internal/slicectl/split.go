package slicectl

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

func newSplitCommand(g *globalOptions) *cobra.Command {
	var atKey, atHash string
	cmd := &cobra.Command{
		Use:   "split [SLICE] [--at KEY | --at-hash POINT]",
		Short: "Cut a slice in two, at its middle or at a key or point",
		Long: `split cuts the slice SLICE in two: at its middle, or where --at KEY (the key's
hash) or --at-hash POINT says. Both halves keep its replica set. The point must
lie strictly inside the slice; a slice of a single point cannot be split.

Without SLICE, --at KEY (or --at-hash) splits the slice holding that key (or
point) there, which gives the key's hash a slice starting at it, such as one to
move a hot key apart.`,
		Example: `  # Halve a slice.
  slicectl split 0x4000000000000000

  # Cut the slice holding user:42 where user:42 hashes to.
  slicectl split --at user:42

  # Cut a slice at a given point.
  slicectl split 0x4000000000000000 --at-hash 0x4800000000000000`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return positional("SLICE")(0)(cmd, args)
			}
			return sliceArgs("SLICE")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := splitRequest(cmd, args, atKey, atHash)
			if err != nil {
				return err
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.Split(ctx, req)
				if err != nil {
					return err
				}
				return printChange(s, resp.GetChange())
			})
		},
	}
	cmd.Flags().StringVar(&atKey, "at", "", "split where this key hashes to")
	cmd.Flags().StringVar(&atHash, "at-hash", "", "split at this point (0x-prefixed hex or decimal)")
	return cmd
}

// splitRequest builds the request of split from its arguments and --at or --at-hash, which
// cobra has parsed into atKey and atHash.
func splitRequest(cmd *cobra.Command, args []string, atKey, atHash string) (*pb.SplitRequest, error) {
	req := &pb.SplitRequest{}
	switch {
	case cmd.Flags().Changed("at") && cmd.Flags().Changed("at-hash"):
		return nil, usageError(errors.New("--at and --at-hash: give one or the other"))
	case cmd.Flags().Changed("at"):
		if atKey == "" {
			return nil, usageError(errors.New("--at is empty: give a key"))
		}
		req.At = &pb.SplitRequest_AtKey{AtKey: []byte(atKey)}
	case cmd.Flags().Changed("at-hash"):
		p, err := keyspace.ParsePoint(atHash)
		if err != nil {
			return nil, usageError(fmt.Errorf("--at-hash: %w", err))
		}
		req.At = &pb.SplitRequest_AtHash{AtHash: p}
	case len(args) == 0:
		return nil, usageError(fmt.Errorf("missing SLICE: give the slice to split, or --at KEY (usage: %s)", cmd.UseLine()))
	}
	if len(args) == 1 {
		req.Slice = mustSliceRef(args[0])
	}
	return req, nil
}
