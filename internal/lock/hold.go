package lock

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Hold is one goroutine's (reentrant) tenure of a lock.
type Hold struct {
	q      *Queue
	own    *Ownership
	count  int  // reentrancy depth; guarded by q.mu
	lost   bool // detached by a session loss; guarded by q.mu
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// holderKey identifies a hold in a context, for reentrant acquisition.
type holderKey struct {
	e   *Engine
	pfx string
}

func (q *Queue) newHoldLocked() *Hold {
	h := &Hold{q: q, own: q.own, count: 1}
	ctx, cancel := context.WithCancelCause(q.own.ctx)
	h.ctx = context.WithValue(ctx, holderKey{q.e, q.pfx}, h)
	h.cancel = cancel
	q.holder = h
	return h
}

// reenter adds one to h's depth if h still holds the lock.
func (q *Queue) reenter(h *Hold) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if h.lost || q.holder != h {
		return ErrLost
	}
	h.count++
	return nil
}

// Unlock undoes one acquisition of h and drops its queue reference. The
// last one hands the lock to the next local waiter, keeps a retained key,
// or deletes the etcd key: ctx bounds the wait for that (a failed delete is
// retried in the background). Unlock of a lost hold returns its cause.
func (h *Hold) Unlock(ctx context.Context) error {
	err := h.q.release(ctx, h)
	h.q.e.Unref(h.q)
	return err
}

// Ctx is cancelled when the hold ends (released or lost; the cause says
// which) and identifies the holder for reentrant acquisition.
func (h *Hold) Ctx() context.Context { return h.ctx }

// Own is the etcd key the hold is under.
func (h *Hold) Own() *Ownership { return h.own }

// Queue is the hold's queue.
func (h *Hold) Queue() *Queue { return h.q }

// Bind returns a copy of parent that is also cancelled when the hold ends
// (with its cause) and that identifies the holder like Ctx.
func (h *Hold) Bind(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(h.ctx, func() { cancel(context.Cause(h.ctx)) })
	ctx = context.WithValue(ctx, holderKey{h.q.e, h.q.pfx}, h)
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// IsOwner is the etcd comparison that holds exactly while the hold's key
// exists as it was created: the fence of every write the lock protects.
func (h *Hold) IsOwner() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(h.own.key), "=", h.own.rev)
}

// Txn starts a transaction fenced by the hold (If IsOwner plus cmps).
func (h *Hold) Txn(ctx context.Context, cmps ...clientv3.Cmp) clientv3.Txn {
	return h.q.e.kv.Txn(ctx).If(append([]clientv3.Cmp{h.IsOwner()}, cmps...)...)
}
