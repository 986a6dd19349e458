package segments

import (
	"context"
	"time"

	"github.com/stockctl/stockctl/internal/background"
)

// Eviction. A seller (its lock queues, its segments' caches, its view) is
// made for a SKU on its first order in this process. One that nobody used
// for SellerIdle and that holds no segment is forgotten, with the caches of
// the SKU's places, so that the SKUs of a sale that ended cost nothing but
// their cached meta. The next order of the SKU makes a new one.

// reap evicts idle sellers now and then, until ctx ends.
func (e *Engine) reap(ctx context.Context) {
	if e.cfg.SellerIdle <= 0 {
		return
	}
	period := max(e.cfg.SellerIdle/4, 100*time.Millisecond)
	for background.Sleep(ctx, period) {
		e.evictIdle(time.Now())
	}
}

// evictIdle evicts the sellers idle since before now − SellerIdle.
func (e *Engine) evictIdle(now time.Time) {
	var victims []*seller
	e.mu.Lock()
	for name, s := range e.sellers {
		if s.users > 0 || now.Sub(s.lastUsed) < e.cfg.SellerIdle || !s.quiet() {
			continue
		}
		delete(e.sellers, name)
		victims = append(victims, s)
		for id, st := range e.places {
			if id.sku == name && st.unused() {
				delete(e.places, id)
			}
		}
	}
	e.mu.Unlock()
	for _, s := range victims {
		e.lockWatch.unregister(s)
		s.mu.Lock()
		for i, t := range s.timers {
			t.Stop()
			delete(s.timers, i)
		}
		s.mu.Unlock()
		s.qmu.Lock()
		s.reaped = true
		for i := range s.qs {
			if q := s.qs[i].Swap(nil); q != nil {
				e.locks.Unref(q)
			}
		}
		s.qmu.Unlock()
	}
}

// quiet reports whether nothing runs in the seller and it holds nothing:
// no order waits for a slot, no pull, growth or claim runs, and every
// segment's lock queue is idle.
func (s *seller) quiet() bool {
	s.mu.Lock()
	busy := s.waiters.Len() > 0 || s.claiming || s.pulling != nil || s.growing != nil
	s.mu.Unlock()
	if busy {
		return false
	}
	for i := range s.qs {
		if q := s.qs[i].Load(); q != nil && !q.Idle() {
			return false
		}
	}
	return true
}

// unused reports whether no order of this process reserved anything at the
// place.
func (st *placeState) unused() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.pending == 0 && st.reserved == 0
}
