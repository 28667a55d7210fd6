package kvcluster_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The policy the assigners of a secured cluster run with parses, and lets routers and nodes
// list the nodes (a viewer's method) without making them admins.
func TestThePolicyLetsRoutersAndNodesView(t *testing.T) {
	path, err := kvcluster.WritePolicy(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := authz.LoadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"router", "node"} {
		id := mtls.Identity{ID: "spiffe://sliceplane/" + kind + "/x", Kind: kind, Name: "x"}
		roles := p.Roles(id)
		if !roles[authz.RoleViewer] || roles[authz.RoleAdmin] {
			t.Errorf("%s: roles %s, want viewer and not admin", id, roles)
		}
	}
	if roles := p.Roles(mtls.Identity{ID: "spiffe://sliceplane/distributor/d", Kind: "distributor", Name: "d"}); roles[authz.RoleViewer] {
		t.Errorf("a distributor: roles %s, want no viewer", roles)
	}
}
