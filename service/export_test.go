package service

import (
	"context"
	"time"
)

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

// BodiesReading counts the request bodies the server is reading now.
func BodiesReading(s *Server) int { return len(s.handler.(*front).reading) }

// SnapshotPagesHeld counts the WatchOrders snapshot pages held now.
func SnapshotPagesHeld(s *Server) int { return len(s.snapshotPages) }

// LapseHold moves the expiry of the live unary hold id into the past, as if
// its keeper goroutine were late to notice (a paused or starved server).
func LapseHold(s *Server, id string) {
	s.holds.mu.Lock()
	defer s.holds.mu.Unlock()
	if ls := s.holds.live[id]; ls != nil {
		ls.expires = ls.expires.Add(-ls.spec.ttl - time.Second)
	}
}
