package lock

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An acquisition is this process's wait in etcd for a lock's key, made for
// the goroutine whose turn it is. When that goroutine gives up (its wait
// budget ends) while other goroutines of the process wait for the same
// lock, the acquisition goes on for them: the key keeps its place in etcd's
// queue and is handed to the head waiter once granted.
//
// Without this, each give-up deleted the key and the next waiter put a new
// one at the back of etcd's queue. A holder keeps a contended stock segment
// up to TenureMaxHold (250 ms) while it is selling, longer than an order's
// FallbackWait (50 ms): so at the end of a fragmented sale a process's
// place was reset every 50 ms, its key deleted and put again, and it could
// wait through many holders' tenures without ever reaching the front (the
// convoy of docs/hotpath.md's "Known weakness"). A goroutine that gives up
// still returns at once with its own error; only the key outlives it, and
// only while someone of the process still wants the lock.
type acquisition struct {
	cancel context.CancelCauseFunc
	result chan acqResult // buffered; receives the result unless orphaned
	// Guarded by the queue's mu.
	finished bool // the etcd wait has ended
	orphaned bool // its goroutine gave up: the result goes to the waiters
}

// errNoWaiterLeft ends an orphaned acquisition that nobody waits for.
var errNoWaiterLeft = errors.New("lock: no goroutine waits for the lock any more")

// waitForKey acquires the etcd key for the caller (who has the turn),
// waiting as long as ctx allows; see acquisition.
func (q *Queue) waitForKey(ctx context.Context, reads []clientv3.Op) (*Hold, []*etcdserverpb.ResponseOp, error) {
	actx, cancel := context.WithCancelCause(q.e.bg.Ctx())
	a := &acquisition{cancel: cancel, result: make(chan acqResult, 1)}
	q.mu.Lock()
	q.acq = a
	q.mu.Unlock()
	started := q.e.bg.Go(func(context.Context) {
		r := q.lockEtcd(actx, false, reads)
		cancel(nil)
		q.mu.Lock()
		a.finished = true
		if q.acq == a {
			q.acq = nil
		}
		if !a.orphaned {
			q.mu.Unlock()
			a.result <- r
			return
		}
		q.settleOrphanLocked(r) // unlocks mu
		q.e.Unref(q)            // the reference the orphaning took
	})
	if !started {
		cancel(ErrClosed)
		q.mu.Lock()
		q.acq = nil
		q.mu.Unlock()
		return q.settle(acqResult{err: ErrClosed})
	}
	select {
	case r := <-a.result:
		return q.settle(r)
	case <-ctx.Done():
	}
	// The caller gives up. Its reference on q keeps q alive for the Ref.
	q.e.Ref(q)
	q.mu.Lock()
	if !a.finished && q.waiters.Len() > 0 {
		a.orphaned = true
		q.mu.Unlock()
		return nil, nil, context.Cause(ctx)
	}
	q.mu.Unlock()
	q.e.Unref(q)
	a.cancel(context.Cause(ctx))
	// As before: the wait's own cleanup runs, and a key granted at the
	// last moment is the caller's.
	return q.settle(<-a.result)
}

// abandonLocked ends the orphaned acquisition in progress when no goroutine
// waits for it any more: its key is removed. The caller holds q.mu.
func (q *Queue) abandonLocked() {
	if a := q.acq; a != nil && a.orphaned && !a.finished && q.waiters.Len() == 0 {
		a.cancel(errNoWaiterLeft)
	}
}

// settleOrphanLocked ends an orphaned acquisition with r: the key goes to
// the head waiter, or, when none is left, ends as a hold would (kept idle
// by a retained queue, deleted otherwise); a failure gives the turn to the
// head waiter, which tries anew. It unlocks q.mu.
func (q *Queue) settleOrphanLocked(r acqResult) {
	h, err := q.settleLocked(&r)
	if err != nil {
		q.mu.Unlock()
		return
	}
	w := q.popLocked()
	if w != nil {
		w.ready <- turn{h: h}
	}
	q.mu.Unlock()
	if q.watched {
		q.e.watchOwned(r.own)
	}
	if w == nil {
		_ = q.release(q.e.bg.Ctx(), h)
	}
}
