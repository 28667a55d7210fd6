package registry_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/target/registry"
)

// base is a flags' core config before its defaults are filled.
func base() core.Config {
	return core.Config{NodeTTL: 10 * time.Second, Algorithm: "weighted-move", Params: map[string]string{"hold_passes": "5"}}
}

func TestAConfigAppliesOverTheFlags(t *testing.T) {
	c, err := registry.Parse([]byte("roles: primary-secondary\nexclusive: true\nnode_ttl: 20s\nmin_replicas: 2\n" +
		"max_replicas: 3\nzone_label: zone\nchurn_budget: 0.05\nimbalance_tolerance: loose\n"))
	require.NoError(t, err)
	got, err := c.Apply(base())
	require.NoError(t, err)
	assert.Equal(t, "primary-secondary", got.Roles)
	assert.True(t, got.Exclusive)
	assert.Equal(t, 20*time.Second, got.NodeTTL)
	assert.Equal(t, 60*time.Second, got.QuarantineWindow, "defaults follow the target's node TTL, not the flags'")
	assert.Equal(t, 2, got.MinReplicas)
	assert.Equal(t, "zone", got.ZoneLabel)
	assert.Equal(t, map[string]string{"hold_passes": "5", "max_replicas": "3", "max_churn": "0.05", "dead_band": "0.4"}, got.Params)

	empty, err := registry.Parse(nil)
	require.NoError(t, err)
	got, err = empty.Apply(base())
	require.NoError(t, err)
	assert.Equal(t, 10*time.Second, got.NodeTTL, "an empty config is the flags")
	assert.Equal(t, "5", got.Params["hold_passes"])

	other, err := registry.Parse([]byte("algorithm: consistent-hash\n"))
	require.NoError(t, err)
	got, err = other.Apply(base())
	require.NoError(t, err)
	assert.Empty(t, got.Params, "another algorithm does not take the flags' params")
	assert.Equal(t, "weighted-move", base().Algorithm, "the flags are left as they were")
}

func TestABadConfigNamesItsField(t *testing.T) {
	for config, field := range map[string]string{
		"churn_budget: 0\n":                  "churn_budget",
		"imbalance_tolerance: medium\n":      "imbalance_tolerance",
		"node_ttl: 10\n":                     "node_ttl",
		"node_ttl: 500ms\n":                  "node_ttl",
		"min_replicas: -1\n":                 "min_replicas",
		"min_replicas: 3\nmax_replicas: 2\n": "max_replicas",
		"roles: masters\n":                   "roles",
		"exclusive: true\n":                  "exclusive",
		"algorithm: nope\n":                  "nope",
		"params: {max_churn: lots}\n":        "max_churn",
		"node_tll: 10s\n":                    "node_tll",
		"source: {source: postgres}\n":       "needs --pg-dsn",
		"source: {pg-tabel: t}\n":            "pg-tabel",
	} {
		c, err := registry.Parse([]byte(config))
		if err == nil {
			_, err = c.Apply(base())
		}
		assert.ErrorIs(t, err, target.ErrInvalid, config)
		assert.ErrorContains(t, err, field, config)
	}
}

func TestATargetsFile(t *testing.T) {
	recs, err := registry.ParseFile([]byte("targets:\n  kv: {min_replicas: 2}\n  counter:\n    roles: primary-secondary\n  empty: {}\n"))
	require.NoError(t, err)
	require.Len(t, recs, 3)
	assert.Equal(t, []string{"counter", "empty", "kv"}, []string{recs[0].Name, recs[1].Name, recs[2].Name})
	assert.Equal(t, "primary-secondary", recs[0].Config.Roles)
	assert.Equal(t, 2, *recs[2].Config.MinReplicas)
	for file, says := range map[string]string{
		"targets:\n  Kv: {}\n":               `name "Kv"`,
		"targets:\n  default: {}\n":          "default target",
		"targets:\n  kv: {min_replica: 2}\n": "target kv",
		"target:\n  kv: {}\n":                "target",
	} {
		_, err := registry.ParseFile([]byte(file))
		assert.ErrorContains(t, err, says, file)
	}
}

// TestASourceIsReadAndItsPasswordNotShown: a target's source reads as the source flags do,
// and the registry shows its DSN without the password, in either of libpq's forms.
func TestASourceIsReadAndItsPasswordNotShown(t *testing.T) {
	c, err := registry.Parse([]byte("source: {source: postgres, pg-dsn: 'postgres://app:s3cret@db/app', pg-table: items}\n"))
	require.NoError(t, err)
	_, err = c.Apply(base())
	require.NoError(t, err)
	opts, has, err := c.SourceOptions()
	require.NoError(t, err)
	assert.True(t, has)
	assert.Equal(t, "items", opts.PG.Table)
	shown := string(c.Redacted().Marshal())
	assert.NotContains(t, shown, "s3cret")
	assert.Contains(t, shown, "postgres://app:REDACTED@db/app")
	assert.Contains(t, string(c.Marshal()), "s3cret", "the stored config keeps it")

	kv := registry.Config{Source: map[string]string{"source": "postgres", "pg-dsn": "host=db password='a b' user=app"}}
	assert.Equal(t, "host=db password=REDACTED user=app", kv.Redacted().Source["pg-dsn"])
	_, has, err = registry.Config{}.SourceOptions()
	require.NoError(t, err)
	assert.False(t, has, "no source: the target's etcd data prefix")
}

func TestAFileOfTargetsReadsBackAsWritten(t *testing.T) {
	two := 2
	recs, err := registry.ParseFile(registry.MarshalFile(map[string]registry.Config{"kv": {MinReplicas: &two}, "empty": {}}))
	require.NoError(t, err)
	require.Len(t, recs, 2)
	assert.Equal(t, "empty", recs[0].Name)
	assert.True(t, recs[0].Config.Equal(registry.Config{}))
	assert.Equal(t, "kv", recs[1].Name)
	assert.Equal(t, 2, *recs[1].Config.MinReplicas)
}
