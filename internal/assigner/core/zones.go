package core

import (
	"github.com/sliceplane/sliceplane/internal/assignment"
)

// zones returns the zone of each node of live, read from its Config.ZoneLabel label, or
// nil when no zone label is configured. A node without the label is in the zone "", which
// the balancer treats like any other name: unlabelled nodes count as one zone.
func (c *Core) zones(live *assignment.NodeSet) map[assignment.NodeID]string {
	if c.cfg.ZoneLabel == "" {
		return nil
	}
	out := make(map[assignment.NodeID]string, live.Len())
	for _, n := range live.Nodes() {
		if st, ok := c.nodes[n.ID]; ok {
			out[n.ID] = st.Labels[c.cfg.ZoneLabel]
		}
	}
	return out
}
