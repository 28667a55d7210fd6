package slicectl

import (
	"context"
	"fmt"
	"slices"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

type jsonSlice struct {
	jsonRange
	Replicas []string  `json:"replicas"`
	Load     jsonFloat `json:"load"`
	Keys     jsonFloat `json:"keys"`
	Pinned   bool      `json:"pinned"`
	// Loading, Leaving and Since describe a make-before-break handoff under way.
	Loading []string `json:"loading,omitempty"`
	Leaving []string `json:"leaving,omitempty"`
	Since   uint64   `json:"since,omitempty"`
	// Primary takes the slice's writes; Next takes over once Primary has demoted itself.
	Primary string `json:"primary,omitempty"`
	Next    string `json:"next,omitempty"`
	// Token is the fencing token of the primary's grant.
	Token uint64 `json:"token,omitempty"`
}

type jsonSlices struct {
	// Total is how many slices matched, of which Slices lists the first --limit.
	Total  uint32      `json:"total"`
	Slices []jsonSlice `json:"slices"`
}

func newSlicesCommand(g *globalOptions) *cobra.Command {
	var (
		node, sortBy string
		limit        int
	)
	cmd := &cobra.Command{
		Use:   "slices",
		Short: "List the slices with their replicas and load",
		Long: `slices lists the slices of the map: the range of the hash space each covers, the
nodes holding it, its estimated load and number of keys (as the nodes last
reported them), and whether it is pinned. While a slice is handed off
make-before-break, HANDOFF shows the nodes still loading it (they do not serve
it yet), the nodes leaving it (they serve it until no node loads it), and the
map generation the handoff began at. In a cluster with roles (assigner
--roles primary-secondary), PRIMARY names the replica that takes the slice's
writes; "a -> b" says a is demoting itself and b takes over once it has. --node keeps the slices one node
holds; --sort load lists the hottest first; --limit caps the listing (the
assigner caps it at 1000 when --limit is 0).`,
		Example: `  slicectl slices
  slicectl slices --node n3
  slicectl slices --sort load --limit 10
  slicectl slices -o json | jq '.slices[] | select(.pinned)'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sortBy != "key" && sortBy != "load" {
				return usageError(fmt.Errorf("--sort %q: want key or load", sortBy))
			}
			if limit < 0 {
				return usageError(fmt.Errorf("--limit %d: want 0 (the assigner's cap, 1000) or more", limit))
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.ListSlices(ctx, &pb.ListSlicesRequest{Node: node, ByLoad: sortBy == "load", Limit: uint32(limit)})
				if err != nil {
					return err
				}
				if !s.out.table() {
					out := jsonSlices{Total: resp.GetTotal(), Slices: []jsonSlice{}}
					for _, sl := range resp.GetSlices() {
						out.Slices = append(out.Slices, jsonSlice{jsonRange: rangeJSON(sl.GetRange()), Replicas: sl.GetReplicas(),
							Load: jsonFloat(sl.GetLoad()), Keys: jsonFloat(sl.GetKeys()), Pinned: sl.GetPinned(),
							Loading: sl.GetLoading(), Leaving: sl.GetLeaving(), Since: sl.GetSince(),
							Primary: sl.GetPrimary(), Next: sl.GetNext(), Token: sl.GetToken()})
					}
					return s.out.print(out)
				}
				return printSlices(s, resp, node)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "list only the slices this node holds")
	f.StringVar(&sortBy, "sort", "key", "order: key (hash order) or load (hottest first)")
	f.IntVar(&limit, "limit", 0, "list at most this many slices; 0 is the assigner's cap, 1000")
	_ = cmd.RegisterFlagCompletionFunc("node", g.completeNodes)
	_ = cmd.RegisterFlagCompletionFunc("sort", cobra.FixedCompletions([]string{"key", "load"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// showHandoff describes a slice's handoff, or "-" when none is under way.
func showHandoff(sl *pb.SliceInfo) string {
	switch {
	case len(sl.GetLoading()) > 0:
		return fmt.Sprintf("loading %s, leaving %s, since generation %d", showNodes(sl.GetLoading()), showNodes(sl.GetLeaving()), sl.GetSince())
	case len(sl.GetLeaving()) > 0:
		return fmt.Sprintf("loaded; %s lingers, then drops it (since generation %d)", showNodes(sl.GetLeaving()), sl.GetSince())
	}
	return "-"
}

// showPrimary describes a slice's primary: "a", "a -> b" while a hands the role to b, "-"
// for none; with its grant's token, "a #7".
func showPrimary(sl *pb.SliceInfo) string {
	out := sl.GetPrimary()
	switch {
	case out == "":
		return "-"
	case sl.GetNext() != "":
		out += " -> " + sl.GetNext()
	}
	if t := sl.GetToken(); t != 0 {
		out += fmt.Sprintf(" #%d", t)
	}
	return out
}

func printSlices(s *session, resp *pb.ListSlicesResponse, node string) error {
	w := newTable(s.out.w)
	// The handoff column shows only while one is under way, so that the usual listing
	// stays as narrow as it was.
	handoffs := slices.ContainsFunc(resp.GetSlices(), func(sl *pb.SliceInfo) bool { return len(sl.GetLoading())+len(sl.GetLeaving()) > 0 })
	roles := slices.ContainsFunc(resp.GetSlices(), func(sl *pb.SliceInfo) bool { return sl.GetPrimary() != "" })
	header := []string{"START", "END", "REPLICAS"}
	if roles {
		header = append(header, "PRIMARY")
	}
	header = append(header, "LOAD", "KEYS", "PINNED")
	if handoffs {
		header = append(header, "HANDOFF")
	}
	row(w, header...)
	for _, sl := range resp.GetSlices() {
		r := rangeOf(sl.GetRange())
		cells := []string{keyspace.FormatPoint(r.Start), r.End.String(), showNodes(sl.GetReplicas())}
		if roles {
			cells = append(cells, showPrimary(sl))
		}
		cells = append(cells, num(sl.GetLoad()), num(sl.GetKeys()), yesNo(sl.GetPinned()))
		if handoffs {
			cells = append(cells, showHandoff(sl))
		}
		row(w, cells...)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	summary := fmt.Sprintf("%d slices", resp.GetTotal())
	if node != "" {
		summary = fmt.Sprintf("%d slices held by %s", resp.GetTotal(), node)
	}
	if n := len(resp.GetSlices()); uint32(n) < resp.GetTotal() {
		summary = fmt.Sprintf("%d of %s (--limit)", n, summary)
	}
	_, err := fmt.Fprintln(s.out.w, summary)
	return err
}
