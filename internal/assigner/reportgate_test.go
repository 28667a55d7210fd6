package assigner

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAReportGateHoldsEachMemberToItsRate(t *testing.T) {
	g := newReportGate(1) // a burst of 2
	assert.True(t, g.allow("a"))
	assert.True(t, g.allow("a"))
	assert.False(t, g.allow("a"), "past the burst, within the second")
	assert.True(t, g.allow("b"), "another member has its own")

	open := newReportGate(-1)
	for range 1000 {
		assert.True(t, open.allow("a"), "no limit")
	}
}
