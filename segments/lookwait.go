package segments

import (
	"context"
	"errors"
)

// Orders waiting at rung 5 for a place's lock learn from the looks of this
// process's other orders when the SKU has sold out under them: the end of a
// sale is otherwise spent by buyers waiting for segments emptied meanwhile
// (BenchmarkSellOut: a third to a half of a fragmented sale's wall time was
// between its last unit sold and its last buyer's sold-out answer).

// errLooksShort ends an order's lock waits at rung 5: a look of this
// process saw less than the order's quantity in all. It never reaches the
// caller: the order looks again (lockFailure), and that read refuses it or
// finds the stock.
var errLooksShort = errors.New("a look of this process saw too little stock for the order")

// setLook records snap as this process's last look at the SKU and wakes the
// orders waiting for the next one (nextLook).
func (s *seller) setLook(snap *snapshot) {
	s.lastLook.Store(snap)
	s.mu.Lock()
	if s.looked != nil {
		close(s.looked)
		s.looked = nil
	}
	s.mu.Unlock()
}

// nextLook returns a channel closed at this process's next look.
func (s *seller) nextLook() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.looked == nil {
		s.looked = make(chan struct{})
	}
	return s.looked
}

// untilLooksShort returns a child of ctx that ends, with errLooksShort, once
// this process's last look, read at a revision after after (the order's
// own look), shows less than qty in all (at once, if it already does).
// Only a newer look counts: while releases bring stock back and buyers sell
// it, looks of either answer land in any order, and an order sent back by
// an older one than its own would only look again, and again. stop
// releases it; call it when the waits are over.
func (s *seller) untilLooksShort(ctx context.Context, qty, after int64) (waitCtx context.Context, stop func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	go func() {
		for {
			next := s.nextLook()
			if snap := s.lastLook.Load(); snap != nil && snap.rev > after && snap.total() < qty {
				cancel(errLooksShort)
				return
			}
			select {
			case <-wctx.Done():
				return
			case <-next:
			}
		}
	}()
	return wctx, func() { cancel(nil) }
}
