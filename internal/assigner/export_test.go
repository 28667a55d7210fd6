package assigner

import (
	"context"
	"errors"

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
	return inLoop(ctx, l, func(c *Core) { c.alg = brokenAlgorithm{c.alg} })
}

// inLoop runs fn on the core in the leader's loop.
func inLoop(ctx context.Context, l *leadership, fn func(c *Core)) error {
	return l.send(ctx, request{hook: fn, reply: make(chan result, 1)}).err
}
