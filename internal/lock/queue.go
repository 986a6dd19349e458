package lock

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Queue serialises this process's goroutines for one lock and owns the
// lock's etcd key on their behalf.
//
// The etcd key (one per session, see etcdkey.go) is what orders processes;
// the queue orders goroutines. Without it, goroutines sharing a session
// would all "hold" etcd's session-reentrant key at once.
//
// States, all guarded by mu:
//   - free:      holder == nil, own == nil, !busy. An arriving goroutine takes
//     the turn itself (busy = true) and acquires the etcd key.
//   - busy:      one goroutine is acquiring or deleting the etcd key; new
//     arrivals queue.
//   - held:      holder != nil, own != nil. Arrivals queue. On release the
//     hold is handed to the head waiter directly (a cohort handoff, no
//     round trip) while the cohort bounds allow, or the key is deleted
//     and the head waiter is given the turn to acquire anew, behind
//     any other process's waiters.
//
// A retained queue (retained.go) keeps its key between holds.
type Queue struct {
	qbase
	e        *Engine
	pfx      string
	kind     string // the metrics' lock label
	delayPfx string // named locks: where lock-delay records live ("" for stock locks)
	watched  bool   // named locks: the engine's key watch reports their keys' deletion

	mu       sync.Mutex
	holder   *Hold
	own      *Ownership
	busy     bool
	busySess *concurrency.Session // session of the acquisition in progress
	acq      *acquisition         // the etcd wait in progress, if any (acquisition.go)
	waiters  list.List            // of *waiter, oldest first

	retain bool // keep the key between holds (set once, before use)
	// onChange (retained queues) is called, without mu, whenever the queue
	// changes in a way that can change a waiting order's choice: it turned
	// idle, or its key was lost or given back.
	onChange func()
}

// Ownership is this process's tenure of a lock's etcd key. It spans every
// local holder the key is handed through. Its fields never change after it
// is made, except those guarded by its queue's mu.
type Ownership struct {
	sess     *concurrency.Session
	key      string
	rev      int64 // the key's create revision: the base of its holds' fencing tokens
	seenRev  int64 // a revision at which the acquisition saw the key exist
	acquired time.Time
	handoffs int // holds granted under the key after the first (handoffs, joins)
	// delayRecord is the key's lock-delay record, if it wrote one: deleted
	// with the key on release.
	delayRecord string
	ctx         context.Context // ends when the key is released or lost
	cancel      context.CancelCauseFunc

	// Retained queues only; guarded by the queue's mu.
	pins      int         // commits in flight under this key
	yielding  bool        // release the key once no hold and no pin remain
	idleTimer *time.Timer // releases an idle key after TenureIdle
}

// Key is the etcd key.
func (o *Ownership) Key() string { return o.key }

// Rev is the key's create revision: the fence of etcd writes (IsOwner),
// and the base of its holds' tokens (Token).
func (o *Ownership) Rev() int64 { return o.rev }

// Err is nil while the key is this process's, and why it is not any more
// (released, lost) after.
func (o *Ownership) Err() error { return context.Cause(o.ctx) }

// Lease is the lease the key is bound to.
func (o *Ownership) Lease() int64 { return int64(o.sess.Lease()) }

type waiter struct {
	elem  *list.Element // guarded by q.mu; nil once the waiter was dequeued
	ready chan turn     // buffered: the dequeuer never blocks
}

// turn is what a dequeued waiter is told: the lock is handed to it (h), the
// wait failed (err), or, with neither, it is its turn to acquire the etcd key.
type turn struct {
	h   *Hold
	err error
}

// Acquire returns a hold on the lock once this goroutine's turn comes. It
// gives up when ctx ends, leaving the queue as if it had never come. The
// caller holds a reference on q, which the hold's Unlock gives back. Errors:
// ctx's cause, ErrSessionLost, ErrClosed, ErrLocked (noWait), or an etcd
// error.
func (q *Queue) Acquire(ctx context.Context, noWait bool) (*Hold, error) {
	h, _, err := q.AcquireReading(ctx, noWait, nil)
	return h, err
}

// AcquireReading is Acquire that also reads reads in the transaction that
// puts the lock's key: when the key was put and was the oldest at once,
// their answers are returned, as of the revision the lock was taken (a
// cache filled from them is valid under the hold, as if read right after).
// When the hold came otherwise (a local handoff, a wait), answers is nil.
func (q *Queue) AcquireReading(ctx context.Context, noWait bool, reads []clientv3.Op) (*Hold, []*etcdserverpb.ResponseOp, error) {
	if q.e.metrics == nil {
		return q.acquireTurn(ctx, noWait, reads)
	}
	start := time.Now()
	h, answers, err := q.acquireTurn(ctx, noWait, reads)
	q.e.metrics.lockWaited(q.kind, time.Since(start), err)
	return h, answers, err
}

func (q *Queue) acquireTurn(ctx context.Context, noWait bool, reads []clientv3.Op) (*Hold, []*etcdserverpb.ResponseOp, error) {
	q.mu.Lock()
	if h := q.takeIdleLocked(); h != nil {
		q.mu.Unlock()
		return h, nil, nil
	}
	if q.holder == nil && q.own == nil && !q.busy && q.waiters.Len() == 0 {
		q.busy = true
		q.mu.Unlock()
		return q.acquireEtcd(ctx, noWait, reads)
	}
	if noWait {
		q.mu.Unlock()
		return nil, nil, ErrLocked
	}
	w := &waiter{ready: make(chan turn, 1)}
	w.elem = q.waiters.PushBack(w)
	q.mu.Unlock()

	select {
	case t := <-w.ready:
		h, err := q.take(ctx, t)
		return h, nil, err
	case <-ctx.Done():
	}
	q.mu.Lock()
	if w.elem != nil {
		q.waiters.Remove(w.elem)
		w.elem = nil
		q.abandonLocked()
		q.mu.Unlock()
		return nil, nil, context.Cause(ctx)
	}
	q.mu.Unlock()
	// We were dequeued at the moment we gave up: pass the turn on, or the
	// waiters behind us would wait for nobody.
	q.decline(<-w.ready)
	return nil, nil, context.Cause(ctx)
}

func (q *Queue) take(ctx context.Context, t turn) (*Hold, error) {
	switch {
	case t.err != nil:
		return nil, t.err
	case t.h != nil:
		return t.h, nil
	}
	h, _, err := q.acquireEtcd(ctx, false, nil)
	return h, err
}

func (q *Queue) decline(t turn) {
	switch {
	case t.err != nil:
	case t.h != nil:
		_ = q.release(q.e.bg.Ctx(), t.h)
	default:
		q.mu.Lock()
		q.busy, q.busySess = false, nil
		q.grantNextLocked()
		q.mu.Unlock()
	}
}

// acquireEtcd acquires the etcd key, reading reads with its put (see
// AcquireReading). The caller has the turn (busy is set). A wait (not
// noWait) runs as an acquisition that outlives the caller when it gives up
// while other goroutines wait for the lock (acquisition.go).
func (q *Queue) acquireEtcd(ctx context.Context, noWait bool, reads []clientv3.Op) (*Hold, []*etcdserverpb.ResponseOp, error) {
	if noWait {
		return q.settle(q.lockEtcd(ctx, true, reads))
	}
	return q.waitForKey(ctx, reads)
}

// acqResult is what one acquisition of the etcd key came to.
type acqResult struct {
	sess    *concurrency.Session
	own     *Ownership
	answers []*etcdserverpb.ResponseOp
	err     error
}

// lockEtcd puts the etcd key and waits for it under ctx.
func (q *Queue) lockEtcd(ctx context.Context, noWait bool, reads []clientv3.Op) acqResult {
	var answers []*etcdserverpb.ResponseOp
	sess, own, err := q.e.withSession(ctx, func(sess *concurrency.Session) (*Ownership, error) {
		q.mu.Lock()
		q.busySess = sess
		q.mu.Unlock()
		own, a, err := q.e.lockKey(ctx, sess, q, noWait, reads)
		answers = a
		return own, err
	})
	return acqResult{sess: sess, own: own, answers: answers, err: err}
}

// settle ends the turn with r, for the goroutine whose acquisition it was:
// the key becomes the queue's, held by the caller, or the turn passes on.
func (q *Queue) settle(r acqResult) (*Hold, []*etcdserverpb.ResponseOp, error) {
	q.mu.Lock()
	h, err := q.settleLocked(&r)
	q.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	if q.watched {
		q.e.watchOwned(r.own)
	}
	return h, r.answers, nil
}

// settleLocked installs r's key and returns a hold on it, or, when the
// acquisition failed, gives the turn to the head waiter.
func (q *Queue) settleLocked(r *acqResult) (*Hold, error) {
	q.busy, q.busySess = false, nil
	if r.err == nil && isDone(r.sess.Done()) {
		// The session ended between the grant and now; sessionLost may have
		// run before own was visible to it, so own must not be installed.
		r.own.cancel(ErrLost)
		r.err = ErrSessionLost
	}
	if r.err != nil {
		q.grantNextLocked()
		return nil, r.err
	}
	q.own = r.own
	q.e.metrics.handoff(q.kind, viaEtcd)
	return q.newHoldLocked(), nil
}

// grantNextLocked gives the head waiter the turn to acquire, if the lock is free.
func (q *Queue) grantNextLocked() {
	if q.holder != nil || q.own != nil || q.busy {
		return
	}
	if w := q.popLocked(); w != nil {
		q.busy = true
		w.ready <- turn{}
	}
}

func (q *Queue) popLocked() *waiter { return popWaiter(&q.waiters) }

// popWaiter dequeues the oldest waiter of ws (a list of *waiter), or nil.
func popWaiter(ws *list.List) *waiter {
	front := ws.Front()
	if front == nil {
		return nil
	}
	w := ws.Remove(front).(*waiter)
	w.elem = nil
	return w
}

// handOffLocked gives the hold to the head waiter without a round trip.
func (q *Queue) handOffLocked(own *Ownership) {
	own.handoffs++ // the new holder's token sequence
	q.e.metrics.handoff(q.kind, viaLocal)
	w := q.popLocked()
	w.ready <- turn{h: q.newHoldLocked()}
}

// release undoes one acquisition of h. The last one hands the lock to the
// next local waiter, or deletes the etcd key (ctx bounds the wait for that).
func (q *Queue) release(ctx context.Context, h *Hold) error {
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
	h.ended(false)
	own := q.own
	if q.retain {
		q.releaseRetainedLocked(own) // unlocks mu
		return nil
	}
	if q.waiters.Len() > 0 && q.cohortAllows(own) {
		q.handOffLocked(own)
		q.mu.Unlock()
		return nil
	}
	q.own = nil
	q.busy = true
	q.mu.Unlock()

	gone, err := q.e.releaseKey(ctx, own)
	if gone {
		// The session ended in etcd before this process noticed: what the
		// holder did since was not protected.
		err = fmt.Errorf("%w: its etcd key was already gone at unlock", ErrLost)
	}
	own.cancel(ErrNotHeld)

	q.mu.Lock()
	q.busy = false
	q.grantNextLocked()
	q.mu.Unlock()
	return err
}

func (q *Queue) cohortAllows(own *Ownership) bool {
	c := q.e.cfg
	return own.handoffs < min(c.CohortMaxHandoffs, MaxCohortHandoffs) &&
		time.Since(own.acquired) < c.CohortMaxHold &&
		own.ctx.Err() == nil
}

// Lose marks own lost although its session lives (as far as this process
// knows): its key was found gone in etcd (deleted by someone, or its lease
// expired). Waiters get the turn to acquire anew.
func (q *Queue) Lose(own *Ownership, cause error) {
	if q.e.keyGoneAtClose() {
		return // Close ends the hold next, with ErrClosed
	}
	defer q.notify() // after the unlock below
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.own != own {
		return
	}
	q.e.log.Warn("lock lost: its etcd key is gone", "key", own.key, "cause", cause)
	if own.idleTimer != nil {
		own.idleTimer.Stop()
	}
	own.cancel(cause)
	q.detachHolderLocked()
	q.own = nil
	q.grantNextLocked()
}

// detachHolderLocked marks the holder, if any, lost.
func (q *Queue) detachHolderLocked() {
	if q.holder != nil {
		q.holder.lost = true
		q.holder.ended(true)
		q.holder = nil
	}
}

// keyGone loses the queue's key if it is key and was created before rev,
// the revision of its deletion.
func (q *Queue) keyGone(key string, rev int64) {
	q.mu.Lock()
	own := q.own
	q.mu.Unlock()
	if own != nil && own.key == key && own.rev < rev {
		q.Lose(own, fmt.Errorf("%w: its etcd key %s was deleted at revision %d", ErrLost, key, rev))
	}
}

func (q *Queue) keyInUse(_ string, rev int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.busy || (q.own != nil && q.own.rev == rev)
}

func (q *Queue) owned() []*Ownership {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.watched || q.own == nil {
		return nil
	}
	return []*Ownership{q.own}
}

func (q *Queue) unref() { q.e.Unref(q) }

// sessionLost marks the hold under s lost and fails the waiters that were
// waiting on it.
func (q *Queue) sessionLost(s *concurrency.Session, holdCause, waitCause error) {
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
		q.detachHolderLocked()
		q.own = nil
	}
	if !hit {
		return
	}
	for w := q.popLocked(); w != nil; w = q.popLocked() {
		w.ready <- turn{err: waitCause}
	}
}

// NewTestOwnership returns an ownership of key at create revision rev that
// belongs to no session and no queue, live until end is called: for unit
// tests of the packages that build on the engine (their caches and commit
// plans are keyed by ownerships). Its Lease is not to be called.
func NewTestOwnership(key string, rev int64) (own *Ownership, end func(cause error)) {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Ownership{key: key, rev: rev, acquired: time.Now(), ctx: ctx, cancel: cancel}, cancel
}
