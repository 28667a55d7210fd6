package assigner

import (
	"context"

	"github.com/sliceplane/sliceplane/internal/assigner/core"
)

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

// inLoop runs fn on the core in the leader's loop.
func inLoop(ctx context.Context, l *leadership, fn func(c *core.Core)) error {
	return l.send(ctx, request{hook: fn, reply: make(chan result, 1)}).err
}

// def returns the default target's runtime, which tests of one target drive.
func (s *Server) def() *served {
	t, err := s.named("")
	if err != nil {
		panic(err)
	}
	return t
}
