package assignment

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRoleModelsAreParsedByName(t *testing.T) {
	for name, want := range map[string]RoleModel{"": Replicas, "replicas": Replicas, "primary-secondary": PrimarySecondary} {
		m, err := ParseRoleModel(name)
		require.NoError(t, err, name)
		assert.Equal(t, want, m, name)
	}
	_, err := ParseRoleModel("leader-follower")
	assert.EqualError(t, err, `assignment: roles "leader-follower": want replicas or primary-secondary`)
	assert.Equal(t, Replicas, RoleModels()[0], "the default first")
}

func TestRoleModelsRefuseWhatTheyCannotWorkWith(t *testing.T) {
	assert.NoError(t, Replicas.Check(true, false), "replicas move as they like")
	assert.ErrorContains(t, Replicas.Check(false, true), "exclusive cluster gives leases on primary roles")
	assert.NoError(t, PrimarySecondary.Check(false, true))
	assert.ErrorContains(t, PrimarySecondary.Check(true, false), "make-before-break")
}
