package segments

import (
	"context"
)

// grow takes one more segment while this process holds less than its
// share ⌈N/M⌉ (rung 4 of the ladder): a free one (home first) at once, or,
// below ⌊N/M⌋ with none free, by queueing in the background for a segment
// of a process over ⌈N/M⌉ (claimTarget), for at most 4 × TenureMaxHold +
// ClaimWait. It reports whether it took a segment now.
func (s *seller) grow(ctx context.Context, home int) bool { return s.growWhere(ctx, home, nil) }

// growInto is rung 4 of the ladder: grow, into a free segment that snap saw
// holding at least qty.
func (s *seller) growInto(ctx context.Context, home int, snap *snapshot, qty int64) bool {
	return s.growWhere(ctx, home, func(i int) bool { return snap.segs[i] >= qty })
}

// heldByOthers reports whether every place of ps is a segment another
// process holds (as this seller's view has it).
func (s *seller) heldByOthers(ps []Place) bool {
	self := s.self()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range ps {
		if p.IsPool() {
			return false
		}
		if h := holderOf(s.view[p.Index()]); h == 0 || h == self {
			return false
		}
	}
	return true
}

// growWhere is grow taking free segments only where want (nil: any).
func (s *seller) growWhere(ctx context.Context, home int, want func(i int) bool) bool {
	// One growth at a time per seller; an order that finds one running
	// waits for it rather than queue for another (each is a lock round
	// trip), and then looks at its segments again.
	s.mu.Lock()
	if running := s.growing; running != nil {
		s.mu.Unlock()
		select {
		case <-running:
		case <-ctx.Done():
		}
		return true
	}
	done := make(chan struct{})
	s.growing = done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.growing = nil
		s.mu.Unlock()
		close(done)
	}()
	self := s.self()
	held := s.heldCount()
	s.mu.Lock()
	lo, hi := shareOf(s.view, self)
	if held >= hi {
		s.mu.Unlock()
		return false
	}
	var free []int
	owners := map[int64][]int{} // lease → segments it holds
	for _, i := range s.order(home) {
		if s.tenure(i) != nil {
			continue
		}
		if len(s.view[i]) == 0 {
			if want == nil || want(i) {
				free = append(free, i)
			}
			continue
		}
		if holder := holderOf(s.view[i]); holder != self {
			owners[holder] = append(owners[holder], i)
		}
	}
	claim := -1
	if len(free) == 0 && !s.claiming {
		claim = claimTarget(owners, held, lo, hi)
		s.claiming = claim >= 0
	}
	s.mu.Unlock()

	for _, i := range free[:min(len(free), 3)] {
		// The segment's counter and inbox are read in the transaction
		// that takes its lock: its cache is ready without a read of its
		// own (a SKU's first order in this process costs one write).
		st := s.st(i)
		q, err := s.queue(i)
		if err != nil {
			continue // the lock engine is closing
		}
		s.e.locks.Ref(q)
		h, answers, err := q.AcquireReading(ctx, true, st.reads())
		if err != nil {
			s.e.locks.Unref(q)
			continue // taken meanwhile
		}
		if answers != nil {
			_ = st.fill(h.Own(), answers) // an undecodable value: ensure reports it
		}
		_ = h.Unlock(s.e.bg.Ctx()) // kept as an idle tenure
		return true
	}
	if claim >= 0 {
		q, err := s.queue(claim)
		if err != nil {
			s.mu.Lock()
			s.claiming = false
			s.mu.Unlock()
			return false
		}
		s.e.bg.Go(func(bg context.Context) {
			defer func() {
				s.mu.Lock()
				s.claiming = false
				s.mu.Unlock()
				s.wakeHead()
			}()
			cctx, cancel := context.WithTimeout(bg, 4*s.e.cfg.TenureMaxHold+s.e.cfg.ClaimWait)
			defer cancel()
			if h, err := s.acquire(cctx, q, false); err == nil {
				_ = h.Unlock(s.e.bg.Ctx())
			}
		})
	}
	return false
}
