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
type lockQueue struct {
	c    *Coordinator
	pfx  string
	refs int // guarded by c.mu, not mu

	mu       sync.Mutex
	holder   *hold
	own      *ownership
	busy     bool
	busySess *concurrency.Session // session of the acquisition in progress
	waiters  list.List            // of *waiter, oldest first
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
	q.mu.Lock()
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
	return q.newHoldLocked(), nil
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
	if q.waiters.Len() > 0 && q.cohortAllows(own) {
		own.handoffs++
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

// sessionLost marks the hold under s lost and fails the waiters that were
// waiting on it.
func (q *lockQueue) sessionLost(s *concurrency.Session, holdCause, waitCause error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	hit := q.busy && q.busySess == s
	if q.own != nil && q.own.sess == s {
		hit = true
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
