package core

import (
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// BenchCore is benchCore for the benchmarks that feed the driver's web view.
func BenchCore(b *testing.B, nodes, perNode int) (*Core, time.Time) {
	return benchCore(b, nodes, perNode, false, 0)
}

// Pass runs one balancing pass and returns the quantum it would publish and the map after
// it (nil, nil when the pass changes nothing).
func Pass(c *Core, now time.Time) (*quantum.Quantum, *assignment.Assignment, error) {
	ch, err := c.pass(now)
	if err != nil || ch == nil {
		return nil, nil, err
	}
	return ch.quantum, ch.after, nil
}
