package lock

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Hold is one goroutine's (reentrant) tenure of a lock: an exclusive or
// retained lock (a Queue), a shared hold of a read-write lock, or a
// semaphore permit.
type Hold struct {
	e      *Engine
	pfx    string // the queue's key prefix: identifies the lock for reentrancy
	q      *Queue // exclusive and retained holds; nil for shared and semaphore holds
	rel    releaser
	own    *Ownership
	token  int64
	kind   string
	start  time.Time
	count  int  // reentrancy depth; guarded by the queue's mu
	lost   bool // detached by a loss; guarded by the queue's mu
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// releaser ends one acquisition of a hold: the queue kinds implement it.
type releaser interface {
	release(ctx context.Context, h *Hold) error
	unref()
}

// holderKey identifies a hold in a context, for reentrant acquisition.
type holderKey struct {
	e   *Engine
	pfx string
}

// Tokens. A hold's fencing token is its key's create revision shifted left
// by TokenSeqBits, plus the number of holds the key was passed through
// before it (local handoffs, shared joins). Every later key of the lock has
// a larger create revision, so tokens grow strictly across keys as long as
// the sequence stays below 1<<TokenSeqBits (the cohort bound is validated
// against MaxCohortHandoffs), and across holds of one key because the
// sequence grows. Create revisions must stay below 1<<(63-TokenSeqBits),
// about 1.4e14: 89 years of 50,000 writes a second.
const (
	TokenSeqBits            = 16
	MaxCohortHandoffs       = 1<<TokenSeqBits - 1
	tokenSeqMask      int64 = MaxCohortHandoffs
)

// Token is the fencing token of the seq-th hold (0: the first) of a key
// created at rev. seq beyond MaxCohortHandoffs (retained queues only, whose
// holds' tokens nobody reads) saturates.
func Token(rev int64, seq int) int64 {
	return rev<<TokenSeqBits | min(int64(seq), tokenSeqMask)
}

// TokenRevision is the create revision of the key a token was issued under.
func TokenRevision(token int64) int64 { return token >> TokenSeqBits }

// newHold makes a hold of own for the seq-th acquisition of its key.
func (e *Engine) newHold(rel releaser, q *Queue, pfx, kind string, own *Ownership, seq int) *Hold {
	h := &Hold{e: e, pfx: pfx, q: q, rel: rel, own: own, token: Token(own.rev, seq), kind: kind, count: 1}
	ctx, cancel := context.WithCancelCause(own.ctx)
	h.ctx = context.WithValue(ctx, holderKey{e, pfx}, h)
	h.cancel = cancel
	if e.metrics.holdsCounted(kind) {
		h.start = time.Now()
		e.metrics.holdStarted(kind)
	}
	return h
}

// ended records the end of a hold in the metrics; called once per hold,
// when it is released or found lost.
func (h *Hold) ended(lost bool) {
	if !h.start.IsZero() {
		h.e.metrics.holdEnded(h.kind, time.Since(h.start), lost)
	}
}

func (q *Queue) newHoldLocked() *Hold {
	h := q.e.newHold(q, q, q.pfx, q.kind, q.own, q.own.handoffs)
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
	err := h.rel.release(ctx, h)
	h.rel.unref()
	return err
}

// Ctx is cancelled when the hold ends (released or lost; the cause says
// which) and identifies the holder for reentrant acquisition.
func (h *Hold) Ctx() context.Context { return h.ctx }

// Own is the etcd key the hold is under.
func (h *Hold) Own() *Ownership { return h.own }

// Queue is the hold's queue: nil for shared holds and semaphore permits.
func (h *Hold) Queue() *Queue { return h.q }

// Token is the hold's fencing token (see TokenSeqBits): larger than the
// token of every earlier hold of the same lock.
func (h *Hold) Token() int64 { return h.token }

// Bind returns a copy of parent that is also cancelled when the hold ends
// (with its cause) and that identifies the holder like Ctx.
func (h *Hold) Bind(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(h.ctx, func() { cancel(context.Cause(h.ctx)) })
	ctx = context.WithValue(ctx, holderKey{h.e, h.pfx}, h)
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// IsOwner is the etcd comparison that holds exactly while the hold's key
// exists as it was created: the fence of every write the lock protects. It
// fences the process's tenure of the key, not the goroutine: a goroutine
// that handed the key on locally would still pass it.
func (h *Hold) IsOwner() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(h.own.key), "=", h.own.rev)
}

// Txn starts a transaction fenced by the hold (If IsOwner plus cmps).
func (h *Hold) Txn(ctx context.Context, cmps ...clientv3.Cmp) clientv3.Txn {
	return h.e.kv.Txn(ctx).If(append([]clientv3.Cmp{h.IsOwner()}, cmps...)...)
}
