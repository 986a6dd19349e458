package segments

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// lookAt is rung 2 of the ladder: a look at the whole SKU, shared with the
// other orders of this process that look at the same moment (look.go).
// final means it answered the order: a replay when its ID was used, a
// refusal when the SKU held too little in all at the look's revision, or
// the read's error. Otherwise the held segments' inboxes, as read, go into
// their caches.
func (s *seller) lookAt(ctx context.Context, req *allocReq) (*snapshot, placeResult, bool) {
	snap, claim, err := s.e.look(ctx, s.sku, req.order)
	if err != nil {
		return nil, failed(err), true
	}
	s.setLook(snap)
	if claim != nil {
		return snap, result(s.e.replay(ctx, req, claim)), true
	}
	if t := snap.total(); t < req.qty {
		return snap, failed(&InsufficientStockError{SKU: s.sku.name, Want: req.qty, Remaining: t, Revision: snap.rev}), true
	}
	if req.step == nil && s.heldCount() == 0 {
		s.awaitSeat(ctx)
		s.chooseDirect(snap, req.qty, s.directStart(req, req.home), req.routed)
	}
	for i := range s.qs {
		if s.tenure(i) == nil {
			continue
		}
		st := s.st(i)
		st.mu.Lock()
		if st.token != 0 {
			st.seeInboxLocked(snap.inbox[i], snap.inMod[i])
		}
		st.mu.Unlock()
	}
	return snap, placeResult{}, false
}

// heldCanGive reports whether a held segment's cache can give qty now.
func (s *seller) heldCanGive(qty int64) bool {
	for i := range s.qs {
		own := s.tenure(i)
		if own == nil {
			continue
		}
		st := s.st(i)
		st.mu.Lock()
		ok := st.token == own.Rev() && !st.stale && st.availLocked() >= qty
		st.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// looksSoldOut reports whether this process's last look at the SKU saw
// less than qty in all: a hint (never a refusal) that an order should look
// first rather than queue for a slot.
func (s *seller) looksSoldOut(qty int64) bool {
	snap := s.lastLook.Load()
	return snap != nil && snap.total() < qty
}

// pullFromPool moves stock from the pool into the inbox of a held segment
// (home if held), enough for the order and at least a refill batch, in one
// short transaction under the pool's lock (only a lock holder writes a
// counter), so that an order never holds the pool through its step. A
// process holding no segment of the SKU pulls, for an order it may sell
// directly (tryDirect), into the inbox of a segment nobody holds (anyone
// may add to an inbox) and sells from it directly; otherwise it first
// takes a segment. One pull runs at a time per seller: an order that finds
// one running waits for it instead of queueing for another (a storm of
// orders must not queue one pool-lock round trip each), then reports
// whether it can be served now; a pull that finds that another pull already
// brought enough moves nothing. It reports whether the order can be served
// now from a held segment or directly.
func (s *seller) pullFromPool(ctx context.Context, req *allocReq, home int) (bool, error) {
	qty := req.qty
	canGive := func() bool { return s.heldCanGive(qty) || s.directCanGive(req, home) }
	s.mu.Lock()
	if running := s.pulling; running != nil {
		s.mu.Unlock()
		select {
		case <-running:
			return canGive(), nil
		case <-ctx.Done():
			return false, context.Cause(ctx)
		}
	}
	done := make(chan struct{})
	s.pulling = done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.pulling = nil
		s.mu.Unlock()
		close(done)
	}()
	if canGive() {
		return true, nil // another pull (or a refill) got here first
	}
	target := s.pullTarget(home)
	direct := false
	if target < 0 && s.directEligible(req) {
		if target = s.freeSegment(s.directStart(req, home)); target >= 0 {
			direct = true
			if s.stIfMade(target) == nil {
				// Its cache is made now: it missed the looks that the
				// caches already made saw (chooseDirect), and the refill
				// records the inbox only in a cache in use.
				if snap := s.lastLook.Load(); snap != nil {
					s.st(target).see(snap, target)
				}
			}
		}
	}
	if target < 0 && s.grow(ctx, home) {
		// No segment held to pull into: take one (the pool's stock is
		// sold from segments); it may hold enough by itself.
		if target = s.pullTarget(home); target >= 0 {
			if own := s.tenure(target); own != nil {
				if err := s.st(target).ensure(ctx, s.e, own); err != nil {
					return false, err
				}
			}
			if s.heldCanGive(qty) {
				return true, nil
			}
		}
	}
	if target < 0 {
		return false, nil
	}
	// Enough for the orders of this process that found their segments dry
	// just now, not only this one: in a storm one pull, one pool-lock round
	// trip, serves them all. Bounded, so that one process does not take
	// what others' buyers are waiting for too.
	want := max(qty, s.sku.refillBatch, min(s.climbing.Load()*qty, maxPullBatches*s.sku.refillBatch))
	note := func(moved map[int]int64) []clientv3.Op {
		rec := Pull{Segment: target, Qty: moved[target], Lease: fmt.Sprintf("%x", s.self()), At: time.Now().UTC()}
		return []clientv3.Op{clientv3.OpPut(s.e.keys.Pull(s.sku.name), EncodePull(rec))}
	}
	moved, _, err := s.e.refill(ctx, s.sku.name, map[int]int64{target: want}, 0, -1, note, nil)
	if err != nil {
		return false, err
	}
	if moved[target] == 0 {
		return false, nil
	}
	if direct {
		// Refill recorded the new inbox in the segment's direct cache.
		s.directIdx.Store(int32(target))
		return s.directCanGive(req, home), nil
	}
	// Refill recorded the new inbox in the segment's cache.
	st, o := s.st(target), s.tenure(target)
	st.mu.Lock()
	defer st.mu.Unlock()
	return o != nil && st.token == o.Rev() && st.availLocked() >= qty, nil
}

// maxPullBatches bounds a pull, in refill batches.
const maxPullBatches = 8

// pullTarget is the held segment a pull moves stock into: home if held,
// else the first held in ring order; -1 when none is held.
func (s *seller) pullTarget(home int) int {
	for _, i := range s.order(home) {
		if s.tenure(i) != nil {
			return i
		}
	}
	return -1
}
