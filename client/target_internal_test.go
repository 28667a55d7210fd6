package client

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type idleApp struct{}

func (idleApp) Acquire(context.Context, Range, Grant) error    { return nil }
func (idleApp) Release(context.Context, Range) error           { return nil }
func (idleApp) ChangeRole(context.Context, Range, Grant) error { return nil }

// TestAMemberActsInItsTarget: a member's own router, and its calls to the assigner, name
// the member's target (a router of the default target would be refused the map of
// another target by a member's confined certificate).
func TestAMemberActsInItsTarget(t *testing.T) {
	m, err := NewMember(MemberConfig{ID: "m1", Target: "kv", App: idleApp{}, Assigners: []string{"127.0.0.1:1"}, Address: "127.0.0.1:2"})
	require.NoError(t, err)
	assert.Equal(t, "kv", m.router.cfg.Target)
	assert.Equal(t, "kv", m.participant.cfg.Target)
	_, err = NewMember(MemberConfig{ID: "m1", Target: "KV", App: idleApp{}, Assigners: []string{"127.0.0.1:1"}, Address: "127.0.0.1:2"})
	assert.ErrorContains(t, err, `name "KV"`)
}

// TestAClientConnNamesItsRoutersTarget: a ClientConn of "sliceplane:///NAME" through the
// router of target kv sends nothing when NAME is another target; the default target's
// router takes any NAME, as before targets.
func TestAClientConnNamesItsRoutersTarget(t *testing.T) {
	kv, err := NewRouter(RouterConfig{Target: "kv", Assigners: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	assert.NoError(t, kv.names("kv"))
	assert.ErrorContains(t, kv.names("ads"), `the ClientConn names target "ads" (sliceplane:///ads), but its router routes target "kv"`)
	def, err := NewRouter(RouterConfig{Assigners: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	assert.NoError(t, def.names("counter"))
}
