package assigner

import (
	"context"
	"errors"
	"time"

	"github.com/sliceplane/sliceplane/internal/balance"
)

// brokenAlgorithm is an algorithm whose passes fail, for whatever reason a real one might.
type brokenAlgorithm struct{ balance.Algorithm }

func (brokenAlgorithm) Rebalance(balance.Input) (balance.Result, error) {
	return balance.Result{}, errors.New("balance: something broke")
}

// Methods returns the full names (/package.Service/Method) of every method s serves.
func Methods(s *Server) []string {
	var out []string
	for svc, info := range s.grpc.GetServiceInfo() {
		for _, m := range info.Methods {
			out = append(out, "/"+svc+"/"+m.Name)
		}
	}
	return out
}

// BreakPasses makes every balancing pass of the leader fail from now on.
func BreakPasses(ctx context.Context, s *Server) error {
	l := s.leading.Load()
	if l == nil {
		return ErrNotLeader
	}
	_, _, err := l.do(ctx, caller{who: "test"}, func(c *Core, _ time.Time) (*Proposal, any, error) {
		c.alg = brokenAlgorithm{c.alg}
		return nil, nil, nil
	})
	return err
}
