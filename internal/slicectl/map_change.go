package slicectl

import (
	"fmt"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// The override commands change the map or the balancing: move, split, merge, pin, unpin,
// freeze, unfreeze, drain and algorithm, each in a file of its own. Each prints what changed,
// or fails with the assigner's reason for refusing, in which case nothing changed.

// jsonMapChange is what an admin call changed: the quantum it made (its position, the
// generation of the map it led to, its operations), or none when nothing had to change.
type jsonMapChange struct {
	Summary    string       `json:"summary"`
	Position   jsonPosition `json:"position"`
	Generation uint64       `json:"generation"`
	Ops        []jsonOp     `json:"ops"`
}

func mapChangeJSON(c *pb.Change) jsonMapChange {
	return jsonMapChange{Summary: c.GetSummary(), Position: positionJSON(c.GetPosition()), Generation: c.GetGeneration(),
		Ops: opsJSON(c.GetOps())}
}

// printChange prints what an admin call changed.
func printChange(s *session, c *pb.Change) error {
	if !s.out.table() {
		return s.out.print(mapChangeJSON(c))
	}
	w := s.out.w
	fmt.Fprintln(w, c.GetSummary())
	if len(c.GetOps()) == 0 {
		_, err := fmt.Fprintf(w, "  nothing changed: the map stays at generation %d\n", c.GetGeneration())
		return err
	}
	plural := "s"
	if len(c.GetOps()) == 1 {
		plural = ""
	}
	fmt.Fprintf(w, "  quantum %s, generation %d, %d operation%s:\n", showPosition(c.GetPosition()), c.GetGeneration(), len(c.GetOps()), plural)
	for _, op := range c.GetOps() {
		fmt.Fprintf(w, "    %s\n", showOp(op))
	}
	return nil
}
