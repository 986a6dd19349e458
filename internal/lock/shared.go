package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/keys"
)

// sharedQueue is this process's side of the read (shared) mode of a named
// read-write lock. Shared holders do not exclude each other, so there is no
// local FIFO: goroutines of the process join one shared key (a cohort, no
// round trip) while it is open, and put a key of their own when it is not.
//
// A key is open to joiners until one of these closes it:
//   - an exclusive key younger than it appears in etcd (the engine's key
//     watch reports it): a writer waits for this key, and a reader that
//     joined it now would pass the writer. The next reader puts a new key,
//     which queues behind the writer: no writer starvation;
//   - it was acquired CohortMaxHold ago, or MaxCohortHandoffs holds were
//     granted under it (the token sequence's bound), or cohorting is off
//     (WithCohort(0, ...)): a safety net should the key watch lag;
//   - it was lost or released.
//
// A key in acquisition (waiting in etcd for an older writer) is open too:
// readers arriving meanwhile wait with it instead of queueing keys of
// their own, and all of them hold when it is acquired.
type sharedQueue struct {
	qbase
	e        *Engine
	lockPfx  string // the lock's prefix: its exclusive keys
	pfx      string // lockPfx + keys.SharedDir: shared keys
	delayPfx string
	kind     string

	mu        sync.Mutex
	open      *sharedKey                // the key arrivals join, if any
	keys      map[*Ownership]*sharedKey // acquired keys
	pending   map[*sharedKey]bool       // keys in acquisition
	writerRev int64                     // create revision of the youngest exclusive key the watch reported
}

// sharedKey is one shared key of this process. Guarded by its queue's mu.
type sharedKey struct {
	rev     int64         // create revision, once put
	own     *Ownership    // once acquired
	done    chan struct{} // closed when the acquisition ends
	err     error         // the acquisition's error, once done
	noJoin  bool          // a TryLock(0): nobody waits with it
	closed  bool
	waiting int // goroutines waiting with it, or woken and not yet holding
	holds   map[*Hold]struct{}
}

func newSharedQueue(e *Engine, spec Spec) *sharedQueue {
	return &sharedQueue{e: e, lockPfx: spec.Prefix, pfx: spec.Prefix + keys.SharedDir, delayPfx: spec.DelayPrefix,
		kind: spec.Kind, keys: map[*Ownership]*sharedKey{}, pending: map[*sharedKey]bool{}}
}

// acquire returns a shared hold: by joining the open key, or with a key of
// its own. noWait makes one attempt of its own and never waits.
func (q *sharedQueue) acquire(ctx context.Context, noWait bool) (*Hold, error) {
	for {
		q.mu.Lock()
		k := q.open
		if k == nil || noWait || !q.admitsLocked(k) {
			k = &sharedKey{done: make(chan struct{}), noJoin: noWait, holds: map[*Hold]struct{}{}}
			q.pending[k] = true
			if !noWait {
				q.open = k
			}
			q.mu.Unlock()
			return q.acquireKey(ctx, k, noWait)
		}
		if k.own != nil {
			h := q.joinLocked(k)
			q.mu.Unlock()
			return h, nil
		}
		k.waiting++
		q.mu.Unlock()
		h, retry, err := q.waitWith(ctx, k)
		if !retry {
			return h, err
		}
	}
}

// waitWith waits for k's acquisition and joins it; retry says that k
// failed for its own acquirer's reasons (its ctx, a lost key): the caller
// tries again.
func (q *sharedQueue) waitWith(ctx context.Context, k *sharedKey) (h *Hold, retry bool, err error) {
	select {
	case <-k.done:
	case <-ctx.Done():
	}
	q.mu.Lock()
	k.waiting--
	if ctx.Err() != nil {
		release := q.idleLocked(k)
		q.mu.Unlock()
		q.drop(release)
		return nil, false, context.Cause(ctx)
	}
	if k.err == nil && k.own.ctx.Err() == nil {
		h := q.joinLocked(k)
		q.mu.Unlock()
		return h, false, nil
	}
	err = k.err
	release := q.idleLocked(k)
	q.mu.Unlock()
	q.drop(release)
	if errors.Is(err, ErrClosed) || errors.Is(err, ErrSessionLost) {
		return nil, false, err
	}
	return nil, true, nil
}

// admitsLocked reports whether an arrival may join k.
func (q *sharedQueue) admitsLocked(k *sharedKey) bool {
	c := q.e.cfg
	if k.noJoin || k.closed || c.CohortMaxHandoffs == 0 {
		return false
	}
	// Holds granted and promised (waiting) stay below the token sequence's
	// bound, so that every hold's token is its own.
	own := k.own
	if own == nil {
		return k.waiting < MaxCohortHandoffs
	}
	return own.ctx.Err() == nil && own.handoffs+k.waiting < MaxCohortHandoffs && time.Since(own.acquired) < c.CohortMaxHold
}

// joinLocked makes a hold of k's acquired key for the caller: a local
// cohort handoff, with the next token sequence.
func (q *sharedQueue) joinLocked(k *sharedKey) *Hold {
	k.own.handoffs++
	q.e.metrics.handoff(q.kind, viaLocal)
	h := q.e.newHold(q, nil, q.pfx, q.kind, k.own, k.own.handoffs)
	k.holds[h] = struct{}{}
	return h
}

// acquireKey puts and waits for a key of the caller's own, k.
func (q *sharedQueue) acquireKey(ctx context.Context, k *sharedKey, noWait bool) (*Hold, error) {
	sess, own, err := q.e.withSession(ctx, func(sess *concurrency.Session) (*Ownership, error) {
		return q.e.lockShared(ctx, sess, q, k, noWait)
	})
	q.mu.Lock()
	delete(q.pending, k)
	if err == nil && isDone(sess.Done()) {
		own.cancel(ErrLost) // as in Queue.acquireEtcd
		err = ErrSessionLost
	}
	if err != nil {
		k.err = err
		if q.open == k {
			q.open = nil
		}
		close(k.done)
		q.mu.Unlock()
		return nil, err
	}
	k.own = own
	k.closed = k.closed || q.writerRev > own.rev
	q.keys[own] = k
	q.e.metrics.handoff(q.kind, viaEtcd)
	h := q.e.newHold(q, nil, q.pfx, q.kind, own, 0)
	k.holds[h] = struct{}{}
	close(k.done)
	q.mu.Unlock()
	q.e.watchOwned(own)
	return h, nil
}

// putDone is told the create revision of k's key once it is put; a writer
// already seen behind it closes it.
func (q *sharedQueue) putDone(k *sharedKey, rev int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	k.rev = rev
	if q.writerRev > rev {
		k.closed = true
	}
}

// writerQueued is told (by the key watch) that an exclusive key was created
// at rev: every key of ours older than it closes to joiners.
func (q *sharedQueue) writerQueued(rev int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.writerRev = max(q.writerRev, rev)
	for k := range q.pending {
		if k.rev != 0 && k.rev < rev {
			k.closed = true
		}
	}
	for own, k := range q.keys {
		if own.rev < rev {
			k.closed = true
		}
	}
}

// idleLocked reports whether k is acquired, held by nobody and awaited by
// nobody: then it is forgotten, and the caller deletes it (drop) without mu.
func (q *sharedQueue) idleLocked(k *sharedKey) *Ownership {
	if k.own == nil || len(k.holds) > 0 || k.waiting > 0 || q.keys[k.own] != k {
		return nil
	}
	delete(q.keys, k.own)
	if q.open == k {
		q.open = nil
	}
	return k.own
}

// drop deletes a forgotten key in etcd.
func (q *sharedQueue) drop(own *Ownership) error {
	if own == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(q.e.bg.Ctx(), q.e.cfg.ReleaseTimeout)
	defer cancel()
	return q.dropCtx(ctx, own)
}

func (q *sharedQueue) dropCtx(ctx context.Context, own *Ownership) error {
	gone, err := q.e.releaseKey(ctx, own)
	if gone {
		err = fmt.Errorf("%w: its etcd key was already gone at unlock", ErrLost)
	}
	own.cancel(ErrNotHeld)
	return err
}

// release ends one acquisition of h; the last hold of a key deletes it
// (ctx bounds the wait for that).
func (q *sharedQueue) release(ctx context.Context, h *Hold) error {
	q.mu.Lock()
	if h.lost {
		q.mu.Unlock()
		return context.Cause(h.ctx)
	}
	k := q.keys[h.own]
	if k == nil {
		q.mu.Unlock()
		return ErrNotHeld
	}
	if _, ok := k.holds[h]; !ok {
		q.mu.Unlock()
		return ErrNotHeld
	}
	if h.count--; h.count > 0 {
		q.mu.Unlock()
		return nil
	}
	delete(k.holds, h)
	h.cancel(ErrNotHeld)
	h.ended(false)
	own := q.idleLocked(k)
	q.mu.Unlock()
	if own == nil {
		return nil
	}
	return q.dropCtx(ctx, own)
}

func (q *sharedQueue) reenter(h *Hold) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if k := q.keys[h.own]; h.lost || k == nil {
		return ErrLost
	} else if _, ok := k.holds[h]; !ok {
		return ErrLost
	}
	h.count++
	return nil
}

// loseLocked marks k's key lost with cause.
func (q *sharedQueue) loseLocked(k *sharedKey, cause error) {
	k.own.cancel(cause)
	for h := range k.holds {
		h.lost = true
		h.ended(true)
	}
	k.holds = map[*Hold]struct{}{}
	delete(q.keys, k.own)
	if q.open == k {
		q.open = nil
	}
}

func (q *sharedQueue) keyGone(key string, rev int64) {
	if q.e.keyGoneAtClose() {
		return // Close ends the holds next, with ErrClosed
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for own, k := range q.keys {
		if own.key == key && own.rev < rev {
			q.e.log.Warn("lock lost: its etcd key is gone", "key", key)
			q.loseLocked(k, fmt.Errorf("%w: its etcd key %s was deleted at revision %d", ErrLost, key, rev))
		}
	}
}

func (q *sharedQueue) sessionLost(s *concurrency.Session, holdCause, _ error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for own, k := range q.keys {
		if own.sess == s {
			q.loseLocked(k, holdCause)
		}
	}
	// Keys in acquisition end by themselves: their wait ends with the
	// session.
}

func (q *sharedQueue) keyInUse(key string, rev int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) > 0 {
		return true
	}
	for own := range q.keys {
		if own.key == key && own.rev == rev {
			return true
		}
	}
	return false
}

func (q *sharedQueue) owned() []*Ownership {
	q.mu.Lock()
	defer q.mu.Unlock()
	owns := make([]*Ownership, 0, len(q.keys))
	for own := range q.keys {
		owns = append(owns, own)
	}
	return owns
}

func (q *sharedQueue) unref() { q.e.unref(q.pfx, q) }

// lockShared puts a shared key for k and waits until no exclusive key is
// older. The etcd protocol is lockKey's (etcdkey.go) with the youngest
// older exclusive key as the predecessor.
func (e *Engine) lockShared(ctx context.Context, sess *concurrency.Session, q *sharedQueue, k *sharedKey, noWait bool) (*Ownership, error) {
	key := keys.SeqWaiter(q.pfx, int64(sess.Lease()), e.seq.Add(1))
	writers := older{from: q.lockPfx, opts: []clientv3.OpOption{clientv3.WithRange(keys.ExclusiveEnd(q.lockPfx))}}
	// On its own bounded ctx, as lockKey's put.
	pctx, cancelPut := context.WithTimeout(e.bg.Ctx(), e.cfg.ReleaseTimeout)
	resp, err := e.kv.Txn(pctx).Then(withDelayCount(q.delayPfx,
		clientv3.OpPut(key, e.cfg.Identity, clientv3.WithLease(sess.Lease())),
		writers.youngest(0), // every exclusive key is older than ours
	)...).Commit()
	cancelPut()
	if err != nil {
		e.scrubKey(sess, q.pfx, key)
		return nil, fmt.Errorf("put lock key %s: %w", key, e.sessionErr(sess, err))
	}
	put := putResult{rev: resp.Header.Revision, blocked: len(resp.Responses[1].GetResponseRange().Kvs) > 0,
		records: hasRecords(resp.Responses, 2)}
	q.putDone(k, put.rev)
	e.watchSession(sess, put.rev+1) // writers queued behind it close it to joiners
	return e.finishAcquire(ctx, sess, key, put, writers, noWait,
		delaySpec{lockPfx: q.lockPfx, delayPfx: q.delayPfx, writersOnly: true, kind: q.kind})
}
