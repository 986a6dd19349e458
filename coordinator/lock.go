package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/lock"
	"github.com/stockctl/stockctl/segments"
)

// MaxLockNameLen is the longest lock name, in bytes.
const MaxLockNameLen = 256

// MaxSemaphoreLimit bounds a semaphore's limit: each wait step of a
// semaphore reads all of its keys (holders and waiters).
const MaxSemaphoreLimit = lock.MaxLimit

// Lock is one acquisition of a named lock: an exclusive hold (Lock), a
// shared hold of the same lock (RLock), or a permit of a semaphore
// (AcquirePermit). Kind says which.
//
// Holding a Lock is never a guarantee that nobody else holds it: a process
// paused longer than the session TTL, or cut off from etcd, loses the lock
// without knowing at once. Done and Context say so as soon as this process
// notices (its session ends, or the watch it keeps over the locks' keys sees
// the key deleted); to make a write safe anyway, commit it in an etcd
// transaction that includes IsOwner (see Txn): etcd then applies it only
// while the lock is really held. Outside etcd, pass Token with the write and
// have the store refuse tokens lower than the highest it has seen.
type Lock struct {
	h        *lock.Hold
	name     string
	kind     LockKind
	limit    int
	unlocked atomic.Bool
}

// LockKind is the kind of a hold.
type LockKind int

// Kinds of holds.
const (
	// KindExclusive: one holder at a time (Lock).
	KindExclusive LockKind = iota + 1
	// KindShared: any number of shared holders of a lock, none while an
	// exclusive one holds it (RLock).
	KindShared
	// KindSemaphore: at most the semaphore's limit of holders
	// (AcquirePermit).
	KindSemaphore
)

func (k LockKind) String() string {
	switch k {
	case KindExclusive:
		return "exclusive"
	case KindShared:
		return "shared"
	case KindSemaphore:
		return "semaphore"
	}
	return fmt.Sprintf("LockKind(%d)", int(k))
}

// Lock blocks until it holds the named lock, or ctx ends. Goroutines of one
// process are served in arrival order, processes in the order they queued in
// etcd (with the cohort bounds of WithCohort). ctx bounds the whole wait;
// when it ends, Lock returns its cause and leaves no trace in the queue or
// in etcd.
//
// Reentrancy: called with a ctx that carries a hold of the same lock (the
// lock's Context, or a ctx derived from it), Lock returns at once with a new
// handle on the same hold; the lock is released when every handle has been
// unlocked.
//
// Errors: ctx's cause; ErrSessionLost if the session ended while waiting
// (retrying starts a new one); ErrClosed; ErrInvalidArgument for a bad name;
// ErrLockLost when re-entering a lost hold; ErrLocked after TryFor's
// budget; or the etcd client's error.
func (c *Coordinator) Lock(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, "lock", name, KindExclusive, 0, opts)
}

// An AcquireOption changes how Lock, RLock and AcquirePermit wait.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	try  bool          // TryFor was given
	wait time.Duration // TryFor's budget
}

// TryFor bounds the wait of Lock, RLock or AcquirePermit: after d the call
// gives up with ErrLocked (a ctx ending first still returns ctx's cause).
// TryFor(0) makes one attempt without waiting. Either way a try that fails leaves no key behind. A negative
// d is ErrInvalidArgument. (Redisson's tryLock(waitTime), sync.Mutex's
// TryLock.)
func TryFor(d time.Duration) AcquireOption {
	return func(c *acquireConfig) { c.try, c.wait = true, d }
}

// acquireWait is the lock engine's wait budget of opts: -1 waits until ctx
// ends.
func acquireWait(opts []AcquireOption) (time.Duration, error) {
	var cfg acquireConfig
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case !cfg.try:
		return -1, nil
	case cfg.wait < 0:
		return 0, fmt.Errorf("TryFor(%v): %w: the wait must not be negative", cfg.wait, ErrInvalidArgument)
	}
	return cfg.wait, nil
}

// acquire is every named acquisition: verb names it in errors.
func (c *Coordinator) acquire(ctx context.Context, verb, name string, kind LockKind, limit int, opts []AcquireOption) (*Lock, error) {
	if err := ValidateLockName(name); err != nil {
		return nil, fmt.Errorf("%s: %w", verb, err)
	}
	wait, err := acquireWait(opts)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", verb, name, err)
	}
	if c.fleet != nil { // the cluster the name is placed in
		m, err := c.fleet.lockMember(ctx, name)
		if err == nil {
			err = m.connected(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", verb, name, err)
		}
		l, err := m.c.acquire(ctx, verb, name, kind, limit, opts)
		return l, m.wrap(err)
	}
	spec := lock.Spec{Prefix: c.keys.Lock(name), Limit: limit, Wait: wait}
	switch kind {
	case KindExclusive:
		spec.Mode = lock.Exclusive
	case KindShared:
		spec.Mode = lock.Shared
	case KindSemaphore:
		if limit < 1 || limit > MaxSemaphoreLimit {
			return nil, fmt.Errorf("%s %q: limit %d: %w: must be 1 to %d", verb, name, limit, ErrInvalidArgument, MaxSemaphoreLimit)
		}
		spec.Mode, spec.Prefix = lock.Semaphore, c.keys.Semaphore(name)
	}
	spec.DelayPrefix = c.keys.Delay(spec.Prefix)
	h, err := c.locks.AcquireNamed(ctx, spec)
	switch {
	case errors.Is(err, lock.ErrLimitMismatch):
		if le, ok := errors.AsType[*lock.LimitError](err); ok {
			le.Name = name
		}
		return nil, fmt.Errorf("%s %q: %w: %w", verb, name, ErrConflict, err)
	case errors.Is(err, lock.ErrModeHeld):
		return nil, fmt.Errorf("%s %q: %w: %w", verb, name, ErrInvalidArgument, err)
	case err != nil:
		return nil, fmt.Errorf("%s %q: %w", verb, name, err)
	}
	return &Lock{h: h, name: name, kind: kind, limit: limit}, nil
}

// Unlock releases this handle's hold on the lock; the lock itself is
// released when the last handle of a reentrant hold is unlocked. A second
// Unlock of the same handle returns ErrNotHeld and releases nothing; so does
// an Unlock of a handle whose lock was taken over meanwhile.
//
// ctx bounds the wait for etcd to delete the lock's key. If it ends first,
// or etcd cannot be reached, Unlock returns the error but the release is not
// abandoned: the delete is retried in the background until it succeeds or
// the session ends. Unlock of a lost lock returns its cause (ErrLockLost or
// ErrClosed): whatever the holder did after the loss was not protected.
func (l *Lock) Unlock(ctx context.Context) error {
	if !l.unlocked.CompareAndSwap(false, true) {
		return fmt.Errorf("unlock %q: %w", l.name, ErrNotHeld)
	}
	if err := l.h.Unlock(ctx); err != nil {
		return fmt.Errorf("unlock %q: %w", l.name, err)
	}
	return nil
}

// Name is the lock's (or the semaphore's) name.
func (l *Lock) Name() string { return l.name }

// Kind is the kind of the hold.
func (l *Lock) Kind() LockKind { return l.kind }

// Limit is a semaphore's limit (0 for locks).
func (l *Lock) Limit() int { return l.limit }

// Done is closed when the hold ends: when it is released, or lost because
// the session ended or its etcd key was deleted.
func (l *Lock) Done() <-chan struct{} { return l.h.Ctx().Done() }

// Err is nil while the lock is held, ErrLockLost (or ErrClosed) once it was
// lost, and ErrNotHeld once it was released.
func (l *Lock) Err() error { return context.Cause(l.h.Ctx()) }

// Context returns a context that is cancelled when the hold ends (its cause
// is Err) and that identifies the holder: Lock called with it, or with a
// context derived from it, re-enters this hold.
func (l *Lock) Context() context.Context { return l.h.Ctx() }

// Bind returns a copy of parent that is also cancelled when the hold ends
// (with Err as its cause) and that identifies the holder like Context. Use
// it to run work that must stop when the lock is lost while keeping parent's
// deadline and values.
func (l *Lock) Bind(parent context.Context) (context.Context, context.CancelFunc) {
	return l.h.Bind(parent)
}

// Token is the fencing token. Every exclusive hold of a lock gets a larger
// token than every hold of the name before it, also when the hold was
// passed between goroutines of this process without going back to etcd, so
// a store outside etcd can reject writes carrying a token lower than the
// highest it has seen. Shared holds and semaphore permits, several of which
// hold at once, get tokens that grow per key (Key) instead: a store keeps
// the highest token per key (docs/locks.md, "Fencing tokens", has the
// proof). A reentrant acquisition shares its hold's token.
//
// The token is Revision()<<16 plus the number of holds the key was passed
// through before this one (local handoffs, shared joins; WithCohort bounds
// them below 1<<16): later keys have larger create revisions, so tokens
// grow across keys too, as long as revisions stay below 1<<47 (89 years at
// 50,000 writes a second). A permit or a shared hold passed on under an
// older key may get a lower token than one of a younger key that ended
// before it began; its token is still larger than those of every hold that
// ended before its key was created, and than every earlier hold of its key.
func (l *Lock) Token() int64 { return l.h.Token() }

// Revision is the create revision of the hold's etcd key (Key): what
// IsOwner compares. Holds passed between goroutines of one process share it.
func (l *Lock) Revision() int64 { return l.h.Own().Rev() }

// Key is the hold's etcd key.
func (l *Lock) Key() string { return l.h.Own().Key() }

// Lease is the ID of the lease the lock's key is bound to.
func (l *Lock) Lease() clientv3.LeaseID { return clientv3.LeaseID(l.h.Own().Lease()) }

// IsOwner is the etcd comparison that holds exactly while this process
// holds the lock's key: CreateRevision(Key) == Revision. Put it in the If of
// every transaction the lock protects. It fences the process's tenure of
// the key, not the goroutine: after a local handoff the key stays, so the
// handle of a goroutine that unlocked would still pass it. A process that
// lost the key (its lease expired, the key was deleted) can never pass it
// again. To fence goroutines of one process against each other, compare
// Token with what the protected data records.
func (l *Lock) IsOwner() clientv3.Cmp { return l.h.IsOwner() }

// Txn starts a transaction fenced by the lock: its If is IsOwner plus cmps,
// so the Then branch commits only while the lock is held. A response with
// Succeeded false and no failing cmp of the caller's means the lock was lost.
func (l *Lock) Txn(ctx context.Context, cmps ...clientv3.Cmp) clientv3.Txn {
	return l.h.Txn(ctx, cmps...)
}

// ValidateLockName checks a lock name: 1 to MaxLockNameLen bytes of
// printable ASCII other than space and '/' (a '/' would let one lock's keys
// fall under another's prefix).
func ValidateLockName(name string) error {
	if name == "" || len(name) > MaxLockNameLen {
		return fmt.Errorf("%w: lock name %q: must be 1 to %d bytes", ErrInvalidArgument, name, MaxLockNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || c == '/' {
			return fmt.Errorf("%w: lock name %q: byte %d (%s) is not printable ASCII other than space and '/'",
				ErrInvalidArgument, name, i, segments.DescribeByte(name, i))
		}
	}
	return nil
}
