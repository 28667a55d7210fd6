package ratelimiter

import "github.com/sliceplane/sliceplane/client"

// Member returns the server's member, for tests that ask what it owns.
func (s *Server) Member() *client.Member { return s.member }
