package lock

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
)

// semQueue is this process's side of a named semaphore: its permits (one
// etcd key each, each held by one goroutine) and its local FIFO.
//
// At most one goroutine of the process waits in etcd at a time (the turn,
// as in Queue): processes are served in the order their keys were put, and
// a semaphore never has more waiting keys than processes. Other goroutines
// queue locally. A goroutine that releases a permit while others wait
// locally hands its key to the oldest of them, without a round trip, within
// the cohort bounds (CohortMaxHandoffs, CohortMaxHold); past them it
// deletes the key, and other processes' waiters move up.
//
// All keys of a semaphore carry its limit: an acquisition with another
// limit fails (*LimitError), in this process without a round trip.
type semQueue struct {
	qbase
	e        *Engine
	pfx      string
	delayPfx string
	kind     string

	mu        sync.Mutex
	limit     int                  // of the process's keys and acquisitions; 0 when it has none
	held      map[*Ownership]*Hold // permits held, by key
	busy      bool                 // a goroutine has the turn: it acquires a key in etcd
	busySess  *concurrency.Session
	acquiring int       // acquisitions in etcd (the turn, and TryLock(0)s)
	waiters   list.List // of *waiter, oldest first
}

func newSemQueue(e *Engine, spec Spec) *semQueue {
	return &semQueue{e: e, pfx: spec.Prefix, delayPfx: spec.DelayPrefix, kind: spec.Kind, held: map[*Ownership]*Hold{}}
}

// acquire returns a permit once this goroutine's turn comes. noWait makes
// one attempt of its own in etcd, whatever the local queue, and never waits.
func (q *semQueue) acquire(ctx context.Context, limit int, noWait bool) (*Hold, error) {
	q.mu.Lock()
	if q.limit != 0 && q.limit != limit {
		have := q.limit
		q.mu.Unlock()
		return nil, &LimitError{Want: limit, Have: have}
	}
	q.limit = limit
	if noWait || (!q.busy && q.waiters.Len() == 0) {
		turn := !noWait
		if turn {
			q.busy = true
		}
		q.acquiring++
		q.mu.Unlock()
		return q.acquireEtcd(ctx, limit, noWait, turn)
	}
	w := &waiter{ready: make(chan turn, 1)}
	w.elem = q.waiters.PushBack(w)
	q.mu.Unlock()

	select {
	case t := <-w.ready:
		return q.take(ctx, limit, t)
	case <-ctx.Done():
	}
	q.mu.Lock()
	if w.elem != nil {
		q.waiters.Remove(w.elem)
		w.elem = nil
		q.resetLimitLocked()
		q.mu.Unlock()
		return nil, context.Cause(ctx)
	}
	q.mu.Unlock()
	q.decline(<-w.ready) // dequeued as we gave up: pass it on
	return nil, context.Cause(ctx)
}

func (q *semQueue) take(ctx context.Context, limit int, t turn) (*Hold, error) {
	switch {
	case t.err != nil:
		return nil, t.err
	case t.h != nil:
		return t.h, nil
	}
	return q.acquireEtcd(ctx, limit, false, true)
}

func (q *semQueue) decline(t turn) {
	switch {
	case t.err != nil:
	case t.h != nil:
		_ = q.release(q.e.bg.Ctx(), t.h)
	default:
		q.mu.Lock()
		q.busy, q.busySess = false, nil
		q.acquiring--
		q.grantNextLocked()
		q.resetLimitLocked()
		q.mu.Unlock()
	}
}

// acquireEtcd puts a key and waits for a permit in etcd. turn says the
// caller has the process's turn, which it passes on when done.
func (q *semQueue) acquireEtcd(ctx context.Context, limit int, noWait, turn bool) (*Hold, error) {
	sess, own, err := q.e.withSession(ctx, func(sess *concurrency.Session) (*Ownership, error) {
		if turn {
			q.mu.Lock()
			q.busySess = sess
			q.mu.Unlock()
		}
		return q.e.lockSem(ctx, sess, q, limit, noWait)
	})
	q.mu.Lock()
	q.acquiring--
	if turn {
		q.busy, q.busySess = false, nil
		q.grantNextLocked()
	}
	if err == nil && isDone(sess.Done()) {
		own.cancel(ErrLost) // as in Queue.acquireEtcd
		err = ErrSessionLost
	}
	if err != nil {
		q.resetLimitLocked()
		q.mu.Unlock()
		return nil, err
	}
	h := q.e.newHold(q, nil, q.pfx, q.kind, own, 0)
	q.held[own] = h
	q.e.metrics.handoff(q.kind, viaEtcd)
	q.mu.Unlock()
	q.e.watchOwned(own)
	return h, nil
}

// grantNextLocked gives the head waiter the turn, if nobody has it.
func (q *semQueue) grantNextLocked() {
	if q.busy {
		return
	}
	if w := q.popLocked(); w != nil {
		q.busy = true
		q.acquiring++
		w.ready <- turn{}
	}
}

func (q *semQueue) popLocked() *waiter { return popWaiter(&q.waiters) }

// resetLimitLocked forgets the limit once the process has no key, no
// acquisition and no waiter: the next acquisition may bring another.
func (q *semQueue) resetLimitLocked() {
	if len(q.held) == 0 && q.acquiring == 0 && q.waiters.Len() == 0 {
		q.limit = 0
	}
}

// release gives h's permit to the next local waiter within the cohort
// bounds, or deletes its key (ctx bounds the wait for that).
func (q *semQueue) release(ctx context.Context, h *Hold) error {
	q.mu.Lock()
	if h.lost {
		q.mu.Unlock()
		return context.Cause(h.ctx)
	}
	own := h.own
	if q.held[own] != h {
		q.mu.Unlock()
		return ErrNotHeld
	}
	h.cancel(ErrNotHeld)
	h.ended(false)
	c := q.e.cfg
	if q.waiters.Len() > 0 && own.ctx.Err() == nil &&
		own.handoffs < min(c.CohortMaxHandoffs, MaxCohortHandoffs) && time.Since(own.acquired) < c.CohortMaxHold {
		own.handoffs++
		next := q.e.newHold(q, nil, q.pfx, q.kind, own, own.handoffs)
		q.held[own] = next
		q.e.metrics.handoff(q.kind, viaLocal)
		q.popLocked().ready <- turn{h: next}
		q.mu.Unlock()
		return nil
	}
	delete(q.held, own)
	q.acquiring++ // keeps the limit until the key is gone
	q.mu.Unlock()

	gone, err := q.e.releaseKey(ctx, own)
	if gone {
		err = fmt.Errorf("%w: its etcd key was already gone at unlock", ErrLost)
	}
	own.cancel(ErrNotHeld)
	q.mu.Lock()
	q.acquiring--
	q.resetLimitLocked()
	q.mu.Unlock()
	return err
}

// loseLocked marks own's permit lost with cause.
func (q *semQueue) loseLocked(own *Ownership, cause error) {
	own.cancel(cause)
	if h := q.held[own]; h != nil {
		h.lost = true
		h.ended(true)
	}
	delete(q.held, own)
}

func (q *semQueue) keyGone(key string, rev int64) {
	if q.e.keyGoneAtClose() {
		return // Close ends the holds next, with ErrClosed
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for own := range q.held {
		if own.key == key && own.rev < rev {
			q.e.log.Warn("lock lost: its etcd key is gone", "key", key)
			q.loseLocked(own, fmt.Errorf("%w: its etcd key %s was deleted at revision %d", ErrLost, key, rev))
		}
	}
	q.resetLimitLocked()
}

func (q *semQueue) sessionLost(s *concurrency.Session, holdCause, waitCause error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	hit := q.busy && q.busySess == s
	for own := range q.held {
		if own.sess == s {
			hit = true
			q.loseLocked(own, holdCause)
		}
	}
	if hit {
		for w := q.popLocked(); w != nil; w = q.popLocked() {
			w.ready <- turn{err: waitCause}
		}
	}
	q.resetLimitLocked()
}

func (q *semQueue) keyInUse(key string, rev int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.acquiring > 0 {
		return true
	}
	for own := range q.held {
		if own.key == key && own.rev == rev {
			return true
		}
	}
	return false
}

func (q *semQueue) owned() []*Ownership {
	q.mu.Lock()
	defer q.mu.Unlock()
	owns := make([]*Ownership, 0, len(q.held))
	for own := range q.held {
		owns = append(owns, own)
	}
	return owns
}

func (q *semQueue) unref() { q.e.unref(q.pfx, q) }
