package service

import "context"

// SetAcquireHooks sets the test hooks of Acquire (see Server's fields).
func SetAcquireHooks(s *Server, afterGrant, beforeAnswer func(ctx context.Context)) {
	s.afterGrant, s.beforeAnswer = afterGrant, beforeAnswer
}

// Holds counts the server's live unary holds and the Acquire calls with a
// request_id waiting for their lock.
func Holds(s *Server) (live, waiting int) {
	s.holds.mu.Lock()
	defer s.holds.mu.Unlock()
	for _, rq := range s.holds.requests {
		if rq.waiting {
			waiting++
		}
	}
	return len(s.holds.live), waiting
}
