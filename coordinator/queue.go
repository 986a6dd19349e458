package coordinator

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
)

// lockQueue serialises this process's goroutines for one lock and owns the
// lock's etcd key on their behalf.
//
// The etcd key (one per session, see etcdlock.go) is what orders processes;
// the queue orders goroutines. Without it, goroutines sharing a session
// would all "hold" etcd's session-reentrant key at once.
//
// States, all guarded by mu:
//   - free:      holder == nil, own == nil, !busy. An arriving goroutine takes
//     the turn itself (busy = true) and acquires the etcd key.
//   - busy:      one goroutine is acquiring or deleting the etcd key; new
//     arrivals queue.
//   - held:      holder != nil, own != nil. Arrivals queue. On unlock the hold
//     is handed to the head waiter directly (a cohort handoff, no
//     round trip) while the cohort bounds allow, or the key is deleted
//     and the head waiter is given the turn to acquire anew, behind
//     any other process's waiters.
//
// A retained queue (a segment lock the stock layer sells from, see
// tenure.go) keeps its etcd key when the last hold ends, as a tenure:
//   - idle:      holder == nil, own != nil. An arrival takes a hold at once,
//     without a round trip. After tenureIdle without a hold, or once the
//     stock layer calls yield, the key is released.
//   - yielding:  own.yielding. No new holds; the key is released as soon as
//     the hold in progress ends and no commit made under the key is in
//     flight (pins), so that a yield never fails an order whose step ran.
//
// Local handoffs of a retained queue are not bounded by the cohort
// bounds: the stock layer decides when other processes get the key.
type lockQueue struct {
	c    *Coordinator
	pfx  string
	kind string // segment, pool or named: the metrics' lock label
	refs int    // guarded by c.mu, not mu

	mu       sync.Mutex
	holder   *hold
	own      *ownership
	busy     bool
	busySess *concurrency.Session // session of the acquisition in progress
	waiters  list.List            // of *waiter, oldest first

	retain bool // keep the key between holds (set once, before use)
	// onChange (retained queues) is called, without mu, whenever the queue
	// changes in a way that can change a waiting order's choice: it turned
	// idle, or its key was lost or given back.
	onChange func()
}

// ownership is this process's tenure of a lock's etcd key. It spans every
// local holder the key is handed through.
type ownership struct {
	sess     *concurrency.Session
	key      string
	rev      int64 // the key's create revision: the fencing token
	acquired time.Time
	handoffs int
	ctx      context.Context // ends when the key is released or lost
	cancel   context.CancelCauseFunc

	// Retained queues only; guarded by the queue's mu.
	pins      int         // commits in flight under this key
	yielding  bool        // release the key once no hold and no pin remain
	idleTimer *time.Timer // releases an idle key after tenureIdle
}

// hold is one goroutine's (reentrant) tenure of the lock.
type hold struct {
	q      *lockQueue
	own    *ownership
	count  int  // reentrancy depth; guarded by q.mu
	lost   bool // detached by a session loss; guarded by q.mu
	ctx    context.Context
	cancel context.CancelCauseFunc
}

type waiter struct {
	elem  *list.Element // guarded by q.mu; nil once the waiter was dequeued
	ready chan turn     // buffered: the dequeuer never blocks
}

// turn is what a dequeued waiter is told: the lock is handed to it (h), the
// wait failed (err), or, with neither, it is its turn to acquire the etcd key.
type turn struct {
	h   *hold
	err error
}

// holderKey identifies a hold in a context, for reentrant acquisition.
type holderKey struct {
	c   *Coordinator
	pfx string
}

// acquire returns a hold on the lock once this goroutine's turn comes. It
// gives up when ctx ends or abort is closed, leaving the queue as if it had
// never come. Errors: ctx's cause, errAborted, ErrSessionLost, ErrClosed,
// ErrLocked (noWait), or an etcd error.
func (q *lockQueue) acquire(ctx context.Context, abort <-chan struct{}, noWait bool) (*hold, error) {
	if q.c.metrics == nil {
		return q.acquireTurn(ctx, abort, noWait)
	}
	start := time.Now()
	h, err := q.acquireTurn(ctx, abort, noWait)
	q.c.metrics.lockWaited(q.kind, time.Since(start), err)
	return h, err
}

func (q *lockQueue) acquireTurn(ctx context.Context, abort <-chan struct{}, noWait bool) (*hold, error) {
	q.mu.Lock()
	if h := q.takeIdleLocked(); h != nil {
		q.mu.Unlock()
		return h, nil
	}
	if q.holder == nil && q.own == nil && !q.busy && q.waiters.Len() == 0 {
		q.busy = true
		q.mu.Unlock()
		return q.acquireEtcd(ctx, noWait)
	}
	if noWait {
		q.mu.Unlock()
		return nil, ErrLocked
	}
	w := &waiter{ready: make(chan turn, 1)}
	w.elem = q.waiters.PushBack(w)
	q.mu.Unlock()

	select {
	case t := <-w.ready:
		return q.take(ctx, t)
	case <-ctx.Done():
	case <-abort:
	}
	q.mu.Lock()
	if w.elem != nil {
		q.waiters.Remove(w.elem)
		w.elem = nil
		q.mu.Unlock()
		return nil, waitEnded(ctx)
	}
	q.mu.Unlock()
	// We were dequeued at the moment we gave up: pass the turn on, or the
	// waiters behind us would wait for nobody.
	q.decline(<-w.ready)
	return nil, waitEnded(ctx)
}

func waitEnded(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return errAborted
}

func (q *lockQueue) take(ctx context.Context, t turn) (*hold, error) {
	switch {
	case t.err != nil:
		return nil, t.err
	case t.h != nil:
		return t.h, nil
	}
	return q.acquireEtcd(ctx, false)
}

func (q *lockQueue) decline(t turn) {
	switch {
	case t.err != nil:
	case t.h != nil:
		_ = q.release(q.c.bgCtx, t.h)
	default:
		q.mu.Lock()
		q.busy, q.busySess = false, nil
		q.grantNextLocked()
		q.mu.Unlock()
	}
}

// acquireEtcd acquires the etcd key. The caller has the turn (busy is set).
func (q *lockQueue) acquireEtcd(ctx context.Context, noWait bool) (*hold, error) {
	sess, err := q.c.session(ctx)
	if err == nil {
		q.mu.Lock()
		q.busySess = sess
		q.mu.Unlock()
	}
	var own *ownership
	if err == nil {
		own, err = q.c.lockKey(ctx, sess, q.pfx, noWait)
	}

	q.mu.Lock()
	defer q.mu.Unlock()
	q.busy, q.busySess = false, nil
	if err == nil && isDone(sess.Done()) {
		// The session ended between the grant and now; sessionLost may have
		// run before own was visible to it, so own must not be installed.
		own.cancel(ErrLockLost)
		err = ErrSessionLost
	}
	if err != nil {
		q.grantNextLocked()
		return nil, err
	}
	q.own = own
	q.c.metrics.handoff(q.kind, viaEtcd)
	return q.newHoldLocked(), nil
}

// takeIdle returns a hold on a retained queue's idle key, or nil when it is
// not idle (no key, held, yielding, or waited for): never a round trip.
func (q *lockQueue) takeIdle() *hold {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.takeIdleLocked()
}

func (q *lockQueue) takeIdleLocked() *hold {
	own := q.own
	if own == nil || q.holder != nil || own.yielding || q.waiters.Len() > 0 || own.ctx.Err() != nil {
		return nil
	}
	if own.idleTimer != nil {
		own.idleTimer.Stop()
		own.idleTimer = nil
	}
	q.c.metrics.handoff(q.kind, viaLocal)
	return q.newHoldLocked()
}

// pin keeps own's key from being released until unpin: for a commit made
// under it. It reports false when own is no longer this queue's live key.
func (q *lockQueue) pin(own *ownership) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.own != own || own.ctx.Err() != nil {
		return false
	}
	own.pins++
	return true
}

// unpin ends a pin; the last one lets a yielding key go.
func (q *lockQueue) unpin(own *ownership) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if own.pins > 0 {
		own.pins--
	}
	q.maybeDropLocked(own)
}

// yield gives own's key back to etcd as soon as no hold and no pin remain;
// until then no new hold is granted. Local waiters then queue in etcd
// behind the other processes'.
func (q *lockQueue) yield(own *ownership) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.own != own || own.yielding {
		return
	}
	own.yielding = true
	q.maybeDropLocked(own)
}

// maybeDropLocked releases a retained key that is yielding and unused.
func (q *lockQueue) maybeDropLocked(own *ownership) {
	if q.own != own || !own.yielding || q.holder != nil || own.pins > 0 {
		return
	}
	if own.idleTimer != nil {
		own.idleTimer.Stop()
		own.idleTimer = nil
	}
	q.own = nil
	q.busy = true
	started := q.c.goBackground(func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(ctx, q.c.opts.releaseTimeout)
		_, _ = q.c.releaseKey(rctx, own.sess, own.key, own.rev) // retried in the background on failure
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
func (q *lockQueue) notify() {
	q.mu.Lock()
	f := q.onChange
	q.mu.Unlock()
	if f != nil {
		f()
	}
}

// tenure returns the queue's key if this process holds it and is not
// giving it up, and whether it is idle (no hold, no commit in flight).
func (q *lockQueue) tenure() (own *ownership, idle bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	o := q.own
	if o == nil || o.yielding || o.ctx.Err() != nil {
		return nil, false
	}
	return o, q.holder == nil && o.pins == 0
}

// setRetain makes q a retained queue that calls onChange (see lockQueue).
func (q *lockQueue) setRetain(onChange func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.retain, q.onChange = true, onChange
}

// idleLocked turns a retained queue whose last hold ended idle: the key
// stays, and goes after tenureIdle without a hold. It reports whether the
// queue is now idle (the caller then calls onChange, without mu).
func (q *lockQueue) idleLocked(own *ownership) bool {
	if own.yielding || own.ctx.Err() != nil {
		q.maybeDropLocked(own)
		return false
	}
	own.idleTimer = time.AfterFunc(q.c.opts.tenureIdle, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.own == own && q.holder == nil && !own.yielding {
			own.yielding = true
			q.maybeDropLocked(own)
		}
	})
	return true
}

// grantNextLocked gives the head waiter the turn to acquire, if the lock is free.
func (q *lockQueue) grantNextLocked() {
	if q.holder != nil || q.own != nil || q.busy {
		return
	}
	if w := q.popLocked(); w != nil {
		q.busy = true
		w.ready <- turn{}
	}
}

func (q *lockQueue) popLocked() *waiter {
	front := q.waiters.Front()
	if front == nil {
		return nil
	}
	w := q.waiters.Remove(front).(*waiter)
	w.elem = nil
	return w
}

func (q *lockQueue) newHoldLocked() *hold {
	h := &hold{q: q, own: q.own, count: 1}
	ctx, cancel := context.WithCancelCause(q.own.ctx)
	h.ctx = context.WithValue(ctx, holderKey{q.c, q.pfx}, h)
	h.cancel = cancel
	q.holder = h
	return h
}

// reenter adds one to h's depth if h still holds the lock.
func (q *lockQueue) reenter(h *hold) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if h.lost || q.holder != h {
		return ErrLockLost
	}
	h.count++
	return nil
}

// release undoes one acquisition of h. The last one hands the lock to the
// next local waiter, or deletes the etcd key (ctx bounds the wait for that).
func (q *lockQueue) release(ctx context.Context, h *hold) error {
	q.mu.Lock()
	if h.lost {
		q.mu.Unlock()
		return context.Cause(h.ctx)
	}
	if q.holder != h {
		q.mu.Unlock()
		return ErrNotHeld
	}
	if h.count--; h.count > 0 {
		q.mu.Unlock()
		return nil
	}
	q.holder = nil
	h.cancel(ErrNotHeld)
	own := q.own
	if q.retain {
		// A tenure: hand over locally unless yielding, else keep the key
		// idle (or let it go if yielding).
		if q.waiters.Len() > 0 && !own.yielding && own.ctx.Err() == nil {
			own.handoffs++
			q.c.metrics.handoff(q.kind, viaLocal)
			w := q.popLocked()
			w.ready <- turn{h: q.newHoldLocked()}
			q.mu.Unlock()
			return nil
		}
		idle := q.idleLocked(own)
		onChange := q.onChange
		q.mu.Unlock()
		if idle && onChange != nil {
			onChange()
		}
		return nil
	}
	if q.waiters.Len() > 0 && q.cohortAllows(own) {
		own.handoffs++
		q.c.metrics.handoff(q.kind, viaLocal)
		w := q.popLocked()
		w.ready <- turn{h: q.newHoldLocked()}
		q.mu.Unlock()
		return nil
	}
	q.own = nil
	q.busy = true
	q.mu.Unlock()

	gone, err := q.c.releaseKey(ctx, own.sess, own.key, own.rev)
	if gone {
		// The session ended in etcd before this process noticed: what the
		// holder did since was not protected.
		err = fmt.Errorf("%w: its etcd key was already gone at unlock", ErrLockLost)
	}
	own.cancel(ErrNotHeld)

	q.mu.Lock()
	q.busy = false
	q.grantNextLocked()
	q.mu.Unlock()
	return err
}

func (q *lockQueue) cohortAllows(own *ownership) bool {
	o := q.c.opts
	return own.handoffs < o.cohortMaxHandoffs &&
		time.Since(own.acquired) < o.cohortMaxHold &&
		own.ctx.Err() == nil
}

// lose marks own lost although its session lives: its key was found gone
// in etcd (deleted by someone). Waiters get the turn to acquire anew.
func (q *lockQueue) lose(own *ownership, cause error) {
	defer q.notify() // after the unlock below
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.own != own {
		return
	}
	q.c.log.Warn("lock lost: its etcd key is gone while the session lives", "key", own.key, "cause", cause)
	if own.idleTimer != nil {
		own.idleTimer.Stop()
	}
	own.cancel(cause)
	if q.holder != nil {
		q.holder.lost = true
		q.holder = nil
	}
	q.own = nil
	q.grantNextLocked()
}

// sessionLost marks the hold under s lost and fails the waiters that were
// waiting on it.
func (q *lockQueue) sessionLost(s *concurrency.Session, holdCause, waitCause error) {
	defer q.notify() // after the unlock below
	q.mu.Lock()
	defer q.mu.Unlock()
	hit := q.busy && q.busySess == s
	if q.own != nil && q.own.sess == s {
		hit = true
		if q.own.idleTimer != nil {
			q.own.idleTimer.Stop()
		}
		q.own.cancel(holdCause)
		if q.holder != nil {
			q.holder.lost = true
			q.holder = nil
		}
		q.own = nil
	}
	if !hit {
		return
	}
	for w := q.popLocked(); w != nil; w = q.popLocked() {
		w.ready <- turn{err: waitCause}
	}
}
