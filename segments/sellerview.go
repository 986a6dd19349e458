package segments

import (
	"time"

	"github.com/stockctl/stockctl/internal/lock"
)

// react applies the yield policy to every held segment another process
// waits for, and wakes the head waiter (a segment may have come free).
func (s *seller) react() {
	self := s.self()
	held := s.heldCount()
	s.mu.Lock()
	lo, _ := shareOf(s.view, self)
	type contended struct {
		i   int
		own *lock.Ownership
	}
	var yieldNow, keep []contended
	for i := range s.qs {
		var own *lock.Ownership
		var idle bool
		if q := s.qs[i].Load(); q != nil {
			own, idle = q.Tenure()
		}
		if own == nil || !waitedFor(s.view[i], own.Key(), own.Rev()) {
			if t := s.timers[i]; t != nil {
				t.Stop()
				delete(s.timers, i)
			}
			continue
		}
		if yieldAtOnce(idle, held, lo) {
			yieldNow = append(yieldNow, contended{i, own})
			held--
		} else if s.timers[i] == nil {
			keep = append(keep, contended{i, own})
		}
	}
	for _, k := range keep {
		q, own, i := s.qs[k.i].Load(), k.own, k.i
		s.timers[i] = time.AfterFunc(s.e.cfg.TenureMaxHold, func() {
			s.mu.Lock()
			delete(s.timers, i)
			s.mu.Unlock()
			q.Yield(own)
		})
	}
	s.mu.Unlock()
	for _, y := range yieldNow {
		s.qs[y.i].Load().Yield(y.own)
	}
	s.wakeHead()
}

// wakeHead signals the oldest waiting order to look for a slot.
func (s *seller) wakeHead() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.waiters.Front(); f != nil {
		select {
		case f.Value.(*slotWaiter).wake <- struct{}{}:
		default:
		}
	}
}
