package lock

import (
	"context"
	"time"
)

// Retained queues. A segment lock the stock layer sells from keeps its etcd
// key when the last hold ends, as a tenure:
//   - idle:      holder == nil, own != nil. An arrival takes a hold at once,
//     without a round trip. After TenureIdle without a hold, or once the
//     stock layer calls Yield, the key is released.
//   - yielding:  own.yielding. No new holds; the key is released as soon as
//     the hold in progress ends and no commit made under the key is in
//     flight (pins), so that a yield never fails an order whose step ran.
//
// Local handoffs of a retained queue are not bounded by the cohort bounds:
// the stock layer decides when other processes get the key.

// SetRetain makes q a retained queue that calls onChange, without q's
// mutex, whenever it turns idle or its key is lost or given back.
func (q *Queue) SetRetain(onChange func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.retain, q.onChange = true, onChange
}

// Tenure returns the queue's key if this process holds it and is not giving
// it up, and whether it is idle (no hold, no commit in flight).
func (q *Queue) Tenure() (own *Ownership, idle bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	o := q.own
	if o == nil || o.yielding || o.ctx.Err() != nil {
		return nil, false
	}
	return o, q.holder == nil && o.pins == 0
}

// TakeIdle returns a hold on a retained queue's idle key, or nil when it is
// not idle (no key, held, yielding, or waited for): never a round trip. The
// hold's Unlock drops a queue reference: the caller takes one first.
func (q *Queue) TakeIdle() *Hold {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.takeIdleLocked()
}

func (q *Queue) takeIdleLocked() *Hold {
	own := q.own
	if own == nil || q.holder != nil || own.yielding || q.waiters.Len() > 0 || own.ctx.Err() != nil {
		return nil
	}
	own.stopIdleLocked()
	q.e.metrics.handoff(q.kind, viaLocal)
	return q.newHoldLocked()
}

// Pin keeps own's key from being released until Unpin: for a commit made
// under it. It reports false when own is no longer this queue's live key.
func (q *Queue) Pin(own *Ownership) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.own != own || own.ctx.Err() != nil {
		return false
	}
	own.pins++
	// In use: a plain order takes no hold, only a pin, so the pin is what
	// keeps a busy tenure from being given up as idle.
	own.stopIdleLocked()
	return true
}

// Unpin ends a pin; the last one lets a yielding key go.
func (q *Queue) Unpin(own *Ownership) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if own.pins > 0 {
		own.pins--
	}
	if q.retain && q.own == own && own.pins == 0 && q.holder == nil && !own.yielding && own.ctx.Err() == nil {
		q.startIdleLocked(own) // unused from now on
		return
	}
	q.maybeDropLocked(own)
}

// Yield gives own's key back to etcd as soon as no hold and no pin remain;
// until then no new hold is granted. Local waiters then queue in etcd
// behind the other processes'.
func (q *Queue) Yield(own *Ownership) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.own != own || own.yielding {
		return
	}
	own.yielding = true
	q.maybeDropLocked(own)
}

// releaseRetainedLocked ends the last hold of a retained queue: the key is
// handed to a local waiter unless yielding, else kept idle (or let go if
// yielding). It unlocks q.mu.
func (q *Queue) releaseRetainedLocked(own *Ownership) {
	if q.waiters.Len() > 0 && !own.yielding && own.ctx.Err() == nil {
		q.handOffLocked(own)
		q.mu.Unlock()
		return
	}
	idle := q.idleLocked(own)
	onChange := q.onChange
	q.mu.Unlock()
	if idle && onChange != nil {
		onChange()
	}
}

// maybeDropLocked releases a retained key that is yielding and unused.
func (q *Queue) maybeDropLocked(own *Ownership) {
	if q.own != own || !own.yielding || q.holder != nil || own.pins > 0 {
		return
	}
	own.stopIdleLocked()
	q.own = nil
	q.busy = true
	started := q.e.bg.Go(func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(ctx, q.e.cfg.ReleaseTimeout)
		_, _ = q.e.releaseKey(rctx, own) // retried in the background on failure
		cancel()
		own.cancel(ErrNotHeld)
		q.mu.Lock()
		q.busy = false
		q.grantNextLocked()
		q.mu.Unlock()
		q.notify()
	})
	if !started {
		// Closing: the lease's revocation removes the key.
		own.cancel(ErrClosed)
		q.busy = false
	}
}

// notify calls onChange, if set; the caller does not hold mu.
func (q *Queue) notify() {
	q.mu.Lock()
	f := q.onChange
	q.mu.Unlock()
	if f != nil {
		f()
	}
}

// idleLocked turns a retained queue whose last hold ended idle: the key
// stays, and goes after TenureIdle without a hold or a commit in flight.
// It reports whether the queue is now idle (the caller then calls
// onChange, without mu).
func (q *Queue) idleLocked(own *Ownership) bool {
	if own.yielding || own.ctx.Err() != nil {
		q.maybeDropLocked(own)
		return false
	}
	if own.pins == 0 {
		q.startIdleLocked(own) // with pins, the last Unpin starts it
	}
	return true
}

// startIdleLocked (re)starts own's idle timer: after TenureIdle with no
// hold and no pin, the key is given back.
func (q *Queue) startIdleLocked(own *Ownership) {
	own.stopIdleLocked()
	own.idleTimer = time.AfterFunc(q.e.cfg.TenureIdle, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.own == own && q.holder == nil && own.pins == 0 && !own.yielding {
			own.yielding = true
			q.maybeDropLocked(own)
		}
	})
}

// stopIdleLocked stops own's idle timer, if running (guarded by its
// queue's mu).
func (own *Ownership) stopIdleLocked() {
	if own.idleTimer != nil {
		own.idleTimer.Stop()
		own.idleTimer = nil
	}
}

// Idle reports whether q holds nothing and nobody waits on it: no key (or
// none being acquired or released), no holder, no waiter. The stock layer
// forgets a seller whose queues are all idle.
func (q *Queue) Idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.own == nil && q.holder == nil && !q.busy && q.waiters.Len() == 0
}
