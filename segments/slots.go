package segments

import (
	"context"

	"github.com/stockctl/stockctl/internal/lock"
)

// Slots. An order with a business step runs it while holding a held
// segment's local slot, so that two steps never run on one segment at once
// (the segment's stock is known when the step starts). The orders of a SKU
// wait for slots in one FIFO per process; the oldest takes the first free
// slot of a held segment that can give its quantity, home first. A slot is
// free when no order is in its step there, whatever commits are still in
// flight: the next order's step runs while the previous one's commit is on
// its way (pipelining).

// slot is a held segment's local slot, taken by an order with a step.
type slot struct {
	i    int
	h    *lock.Hold
	part commitPart
}

// pickState says why no slot was taken.
type pickState int

const (
	pickBusy pickState = iota // some held segment can serve, none is free now
	pickDry                   // no held segment can give the quantity
)

// pick takes, without waiting, a free slot of a held segment that can give
// qty (home first), with qty reserved there.
func (s *seller) pick(ctx context.Context, qty int64, home int) (*slot, pickState, error) {
	state := pickDry
	for _, i := range s.order(home) {
		q := s.qs[i].Load()
		if q == nil {
			continue // never made: not held
		}
		own, _ := q.Tenure()
		if own == nil {
			continue
		}
		st := s.st(i)
		st.mu.Lock()
		known := st.token == own.Rev() && !st.stale
		enough := known && st.availLocked() >= qty
		st.mu.Unlock()
		if known && !enough {
			continue
		}
		state = pickBusy
		// Free means no order holds the slot: commits still in flight
		// there (pins) do not keep the next order out; that is the point.
		h := s.takeIdle(q)
		if h == nil {
			continue
		}
		if err := st.ensure(ctx, s.e, h.Own()); err != nil {
			_ = h.Unlock(s.e.bg.Ctx())
			return nil, state, err
		}
		part, ok := reservePart(q, h.Own(), st, qty)
		if !ok {
			_ = h.Unlock(s.e.bg.Ctx())
			continue
		}
		return &slot{i: i, h: h, part: part}, state, nil
	}
	return nil, state, nil
}

// serveStep sells a step order from the held segments (rungs 1 to 4 of the
// ladder): it waits in the FIFO until it is the oldest, then takes a free
// slot, or, when no held segment can give its quantity, climbs the dry
// rungs; when the held segments could give it but none is free, it tries to
// grow and otherwise waits to be woken (a slot freed, a segment taken or
// given up).
func (s *seller) serveStep(ctx context.Context, req *allocReq, home int) placeResult {
	if s.looksSoldOut(req.qty) {
		// The SKU looked sold out: look now, sharing the read with every
		// other order that does, rather than queue for the FIFO's head to
		// look for each order in turn.
		if _, r, final := s.lookAt(ctx, req); final {
			return r
		}
	}
	w := &slotWaiter{wake: make(chan struct{}, 1)}
	s.mu.Lock()
	w.elem = s.waiters.PushBack(w)
	s.mu.Unlock()
	defer s.leave(w)
	dry := dryRungs{}
	for {
		if s.isHead(w) {
			sl, state, err := s.pick(ctx, req.qty, home)
			if err != nil {
				return failed(err)
			}
			if sl != nil {
				s.leave(w) // the next order may take another free slot
				return s.runSlot(ctx, req, sl)
			}
			if state == pickDry {
				s.climbing.Add(1)
				r, again := dry.climb(ctx, s, req, home)
				s.climbing.Add(-1)
				if !again {
					return r
				}
				continue
			}
			if s.grow(ctx, home) {
				continue
			}
		}
		select {
		case <-w.wake:
		case <-ctx.Done():
			return failed(context.Cause(ctx))
		}
	}
}

// runSlot runs req's step in sl and commits it: the slot is freed as soon
// as the step returns, while the commit is still on its way (the part's pin
// keeps the segment's key until the commit is answered).
func (s *seller) runSlot(ctx context.Context, req *allocReq, sl *slot) placeResult {
	cr, r := s.e.stepInSlot(ctx, req, sl.h, sl.part)
	if cr == nil {
		return r
	}
	return cr.wait(ctx)
}

func (s *seller) isHead(w *slotWaiter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiters.Front() == w.elem
}

// leave takes w out of the queue (once) and wakes the new head.
func (s *seller) leave(w *slotWaiter) {
	s.mu.Lock()
	if w.elem == nil {
		s.mu.Unlock()
		return
	}
	s.waiters.Remove(w.elem)
	w.elem = nil
	s.mu.Unlock()
	s.wakeHead()
}
