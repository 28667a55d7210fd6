package kvnode

// SetFresh replaces what says whether the node may answer from its data.
func (s *Server) SetFresh(f func() (bool, string)) { s.fresh = f }
