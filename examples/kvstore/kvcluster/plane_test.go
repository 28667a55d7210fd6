package kvcluster

import (
	"os"
	"testing"

	"github.com/sliceplane/sliceplane/internal/target/registry"
)

// The targets file a plane gives its assigners reads back as the targets it was given,
// each with its config, as the assigners' --targets reads it.
func TestTheTargetsFileReadsBackAsItsTargets(t *testing.T) {
	exclusive, replicas := true, 2
	want := map[string]registry.Config{
		"counter": {Roles: "primary-secondary", Exclusive: &exclusive, NodeTTL: "3s"},
		"kv":      {MinReplicas: &replicas},
		"plain":   {},
	}
	path, err := writeTargets(t.TempDir(), want)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := registry.ParseFile(data)
	if err != nil {
		t.Fatalf("%v:\n%s", err, data)
	}
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d:\n%s", len(got), len(want), data)
	}
	for _, r := range got {
		if !r.Config.Equal(want[r.Name]) {
			t.Errorf("target %s reads back as %s, want %s", r.Name, r.Config.Marshal(), want[r.Name].Marshal())
		}
	}
}
