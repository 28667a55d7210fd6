package slicectl

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

type jsonLookup struct {
	Key        *string   `json:"key,omitempty"`
	Hash       string    `json:"hash"`
	Slice      jsonRange `json:"slice"`
	Replicas   []string  `json:"replicas"`
	Primary    string    `json:"primary,omitempty"`
	Next       string    `json:"next,omitempty"`
	Token      uint64    `json:"token,omitempty"`
	Generation uint64    `json:"generation"`
}

func newLookupCommand(g *globalOptions) *cobra.Command {
	var hash string
	cmd := &cobra.Command{
		Use:   "lookup [KEY | --hash POINT]",
		Short: "Show the slice and replicas holding a key or a hash",
		Long: `lookup shows where a key lives now: its hash (xxhash64 of the key), the slice
holding that point of the hash space, the nodes holding the slice, and the
generation of the map the answer comes from; in a cluster with roles, the
replica that takes the key's writes. --hash looks up a point instead of a
key.`,
		Example: `  slicectl lookup user:42
  slicectl lookup --hash 0x8000000000000000
  slicectl lookup user:42 -o json | jq -r '.replicas[0]'`,
		Args: positional("KEY")(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &pb.LookupRequest{}
			var key *string
			switch {
			case len(args) == 1 && cmd.Flags().Changed("hash"):
				return usageError(fmt.Errorf("KEY %q and --hash %s: give one or the other", args[0], hash))
			case len(args) == 1:
				if args[0] == "" {
					return usageError(fmt.Errorf("KEY is empty"))
				}
				key = &args[0]
				req.Target = &pb.LookupRequest_Key{Key: []byte(args[0])}
			case cmd.Flags().Changed("hash"):
				h, err := keyspace.ParsePoint(hash)
				if err != nil {
					return usageError(fmt.Errorf("--hash: %w", err))
				}
				req.Target = &pb.LookupRequest_Hash{Hash: h}
			default:
				return usageError(fmt.Errorf("missing KEY: give a key or --hash (usage: %s)", cmd.UseLine()))
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.assign.Lookup(ctx, req)
				if err != nil {
					return err
				}
				out := jsonLookup{Key: key, Hash: keyspace.FormatPoint(resp.GetHash()), Slice: rangeJSON(resp.GetSlice()),
					Replicas: resp.GetReplicas(), Primary: resp.GetPrimary(), Next: resp.GetNext(), Token: resp.GetToken(), Generation: resp.GetGeneration()}
				if !s.out.table() {
					return s.out.print(out)
				}
				w := newTable(s.out.w)
				if key != nil {
					row(w, "key", fmt.Sprintf("%q", *key))
				}
				row(w, "hash", out.Hash)
				row(w, "slice", showRange(resp.GetSlice()))
				row(w, "replicas", showNodes(resp.GetReplicas()))
				if resp.GetPrimary() != "" {
					row(w, "primary", showPrimary(&pb.SliceInfo{Primary: resp.GetPrimary(), Next: resp.GetNext(), Token: resp.GetToken()}))
				}
				row(w, "generation", fmt.Sprint(resp.GetGeneration()))
				return w.Flush()
			})
		},
	}
	cmd.Flags().StringVar(&hash, "hash", "", "look up this point of the hash space (0x-prefixed hex or decimal) instead of a key")
	return cmd
}
