package slicectl

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

type jsonNode struct {
	ID       string            `json:"id"`
	Address  string            `json:"address"`
	Capacity jsonFloat         `json:"capacity"`
	Labels   map[string]string `json:"labels"`
	Slices   uint32            `json:"slices"`
	Load     jsonFloat         `json:"load"`
	Draining bool              `json:"draining"`
	// Stale and SilenceSeconds are what the node last said about its pull stream.
	Stale          bool       `json:"stale"`
	SilenceSeconds float64    `json:"silence_seconds,omitempty"`
	LastSeen       *time.Time `json:"last_seen"`
	// Loading and Primaries count the slices it loads and is the primary of; Roles is the
	// role model a member registered with.
	Loading   uint32 `json:"loading"`
	Primaries uint32 `json:"primaries"`
	Roles     string `json:"roles,omitempty"`
	// Idle says why the node holds no slice, when it holds none.
	Idle string `json:"idle,omitempty"`
}

type jsonNodes struct {
	Nodes []jsonNode `json:"nodes"`
}

// capacity returns a node's capacity weight: 0 means 1.
func capacity(n *pb.Node) float64 {
	if n.GetCapacity() == 0 {
		return 1
	}
	return n.GetCapacity()
}

func newNodesCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List the registered nodes with their slices and load",
		Long: `nodes lists the registered storage nodes by ID: the address they serve on, their
capacity weight, how many slices they hold (replicas included), their estimated
load over their capacity (the unit the nodes report in), whether they are being
drained, whether their data is fresh (DATA: "stale" with how long the node has not
heard from its distributor, "-" before its first heartbeat says), and when the
assigner last heard from them. While any slice moves, LOADING counts the slices
each is still loading (it does not serve them yet); in a cluster with roles,
PRIMARIES counts the slices each is the primary of. A node that stays silent
for the assigner's --node-ttl leaves the map. Below the table, each node that
holds no slice is listed with the reason (draining, balancing frozen, ...).`,
		Example: `  slicectl nodes
  slicectl nodes -o json | jq '.nodes[] | select(.draining)'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				resp, err := s.admin.ListNodes(ctx, &pb.ListNodesRequest{})
				if err != nil {
					return err
				}
				if !s.out.table() {
					out := jsonNodes{Nodes: []jsonNode{}}
					for _, n := range resp.GetNodes() {
						labels := n.GetLabels()
						if labels == nil {
							labels = map[string]string{}
						}
						out.Nodes = append(out.Nodes, jsonNode{ID: n.GetNode().GetId(), Address: n.GetAddress(),
							Capacity: jsonFloat(capacity(n.GetNode())), Labels: labels, Slices: n.GetSlices(), Load: jsonFloat(n.GetLoad()),
							Draining: n.GetDraining(), Stale: n.GetStale(), SilenceSeconds: n.GetSilence().AsDuration().Seconds(),
							LastSeen: jsonTime(n.GetLastSeen()), Loading: n.GetLoading(), Primaries: n.GetPrimaries(), Roles: n.GetRoles(),
							Idle: n.GetIdle()})
					}
					return s.out.print(out)
				}
				return printNodes(s, resp.GetNodes())
			})
		},
	}
}

func printNodes(s *session, nodes []*pb.NodeInfo) error {
	if len(nodes) == 0 {
		_, err := fmt.Fprintln(s.out.w, "no node is registered")
		return err
	}
	labels := slices.ContainsFunc(nodes, func(n *pb.NodeInfo) bool { return len(n.GetLabels()) > 0 })
	w := newTable(s.out.w)
	loading := slices.ContainsFunc(nodes, func(n *pb.NodeInfo) bool { return n.GetLoading() > 0 })
	roles := slices.ContainsFunc(nodes, func(n *pb.NodeInfo) bool { return n.GetPrimaries() > 0 || n.GetRoles() != "" })
	header := []string{"ID", "ADDRESS", "CAPACITY", "SLICES"}
	header = appendIf(appendIf(header, loading, "LOADING"), roles, "PRIMARIES")
	header = append(header, "LOAD", "DRAINING", "DATA", "LAST SEEN")
	if labels {
		header = append(header, "LABELS")
	}
	row(w, header...)
	now := time.Now()
	for _, n := range nodes {
		seen := "never"
		if n.GetLastSeen() != nil {
			seen = ago(n.GetLastSeen().AsTime(), now)
		}
		cells := []string{n.GetNode().GetId(), n.GetAddress(), num(capacity(n.GetNode())), fmt.Sprint(n.GetSlices())}
		cells = appendIf(appendIf(cells, loading, fmt.Sprint(n.GetLoading())), roles, fmt.Sprint(n.GetPrimaries()))
		cells = append(cells, num(n.GetLoad()), yesNo(n.GetDraining()), dataFreshness(n), seen)
		if labels {
			cells = append(cells, showParams(n.GetLabels()))
		}
		row(w, cells...)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, n := range nodes {
		if n.GetIdle() != "" {
			if _, err := fmt.Fprintf(s.out.w, "%s holds no slice: %s\n", n.GetNode().GetId(), n.GetIdle()); err != nil {
				return err
			}
		}
	}
	return nil
}

// dataFreshness describes what a node said about its pull stream: "fresh", "stale/12s"
// (silent for 12 s), or "-" when it said nothing yet.
func dataFreshness(n *pb.NodeInfo) string {
	switch {
	case n.GetStale() && n.GetSilence() != nil:
		return "stale/" + n.GetSilence().AsDuration().Round(time.Second).String()
	case n.GetStale():
		return "stale"
	case n.GetSilence() != nil:
		return "fresh"
	}
	return "-"
}

// appendIf appends cell to cells when cond holds: a column that shows only when it says
// something.
func appendIf(cells []string, cond bool, cell string) []string {
	if cond {
		return append(cells, cell)
	}
	return cells
}
