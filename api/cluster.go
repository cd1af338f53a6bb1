package api

// ForgetKeys drops this node's cached keys of a project. In a cluster, the
// node whose API changed a project's keys (rotate, revoke, delete) drops its
// own at once; the others drop theirs through this, when the change reaches
// them (wired in cmd/relay), before they acknowledge it.
func (s *Server) ForgetKeys(projectID string) { s.keys.invalidate(projectID) }
