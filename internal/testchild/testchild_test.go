package testchild_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/testchild"
)

const env = "TESTCHILD_ECHO"

type spec struct{ Times int }

// echo answers each number with it times the spec's Times.
func echo(s *spec) func(*testchild.Parent) error {
	return func(p *testchild.Parent) error {
		p.Ready()
		var n int
		for p.Recv(&n) {
			if err := p.Send(n * s.Times); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestMain(m *testing.M) {
	var s spec
	testchild.Main(env, &s, echo(&s))
	os.Exit(m.Run())
}

func TestAChildAnswersItsParent(t *testing.T) {
	c := testchild.Start(t, env, spec{Times: 3})
	c.Ready(t)
	for _, n := range []int{1, 7} {
		c.Send(t, n)
		var got int
		c.Recv(t, &got)
		require.Equal(t, 3*n, got)
	}
	c.Stop(t) // returns once the child, its input closed, exited without an error
}
