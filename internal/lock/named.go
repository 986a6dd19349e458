package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockctl/stockctl/internal/keys"
)

// Mode is the kind of hold a named acquisition asks for.
type Mode int

// Modes.
const (
	// Exclusive: one holder at a time (a named lock, or the write side of a
	// read-write lock).
	Exclusive Mode = iota + 1
	// Shared: any number of shared holders, none while an exclusive one
	// holds (the read side of a read-write lock).
	Shared
	// Semaphore: at most Limit holders.
	Semaphore
)

// Spec is a named acquisition.
type Spec struct {
	Mode Mode
	// Prefix is the lock's key prefix: keys.Lock(name) for Exclusive and
	// Shared (shared keys live under Prefix+keys.SharedDir),
	// keys.Semaphore(name) for Semaphore.
	Prefix string
	// DelayPrefix is where the lock's lock-delay records live
	// (keys.Delay(Prefix)); "" when lock-delays do not apply.
	DelayPrefix string
	// Kind is the metrics label; "" picks KindNamed, KindShared or
	// KindSemaphore by Mode.
	Kind string
	// Limit is a semaphore's limit, 1 to MaxLimit.
	Limit int
	// Wait < 0 waits as long as ctx allows; >= 0 is a TryLock budget (0:
	// one attempt), whose end is ErrLocked.
	Wait time.Duration
}

// MaxLimit bounds a semaphore's limit: every wait step reads all of a
// semaphore's keys (holders and waiters), so limits in the thousands would
// make each step read thousands of keys.
const MaxLimit = 1024

// AcquireNamed takes a named lock, a shared hold of a read-write lock, or a
// semaphore permit, as spec says. A ctx carrying a hold of the same lock in
// the same mode re-enters it (not for semaphores: a second Acquire is a
// second permit); a ctx carrying a hold of the same read-write lock in the
// other mode is refused with ErrModeHeld, since waiting could never end.
// ctx bounds the wait; on failure nothing is left in the queue or in etcd
// on the caller's behalf (see Acquire).
// Errors: ctx's cause, ErrLocked, ErrSessionLost, ErrClosed, ErrLost (a
// lost hold re-entered), ErrModeHeld, a *LimitError, or etcd's error.
func (e *Engine) AcquireNamed(ctx context.Context, spec Spec) (*Hold, error) {
	if spec.Kind == "" {
		spec.Kind = map[Mode]string{Exclusive: KindNamed, Shared: KindShared, Semaphore: KindSemaphore}[spec.Mode]
	}
	if err := e.checkMode(ctx, spec); err != nil {
		return nil, err
	}
	var start time.Time
	if e.metrics != nil {
		start = time.Now()
	}
	h, err := e.acquireNamed(ctx, spec)
	if e.metrics != nil && (err == nil || !errors.Is(err, errReentered)) {
		e.metrics.lockWaited(spec.Kind, time.Since(start), err)
	}
	if errors.Is(err, errReentered) {
		return h, nil
	}
	return h, err
}

// errReentered marks a reentrant acquisition, which is no wait.
var errReentered = errors.New("reentered")

func (e *Engine) acquireNamed(ctx context.Context, spec Spec) (*Hold, error) {
	var (
		pfx = spec.Prefix
		mk  func() lockQueue
	)
	switch spec.Mode {
	case Exclusive:
		mk = func() lockQueue {
			return &Queue{e: e, pfx: pfx, kind: spec.Kind, delayPfx: spec.DelayPrefix, watched: true}
		}
	case Shared:
		pfx = spec.Prefix + keys.SharedDir
		mk = func() lockQueue { return newSharedQueue(e, spec) }
	case Semaphore:
		if spec.Limit < 1 || spec.Limit > MaxLimit {
			return nil, fmt.Errorf("semaphore limit %d: must be 1 to %d", spec.Limit, MaxLimit)
		}
		mk = func() lockQueue { return newSemQueue(e, spec) }
	default:
		return nil, fmt.Errorf("lock mode %d unknown", spec.Mode)
	}
	lq, err := e.ref(pfx, mk)
	if err != nil {
		return nil, err
	}
	if h, ok := ctx.Value(holderKey{e, pfx}).(*Hold); ok && spec.Mode != Semaphore {
		if any(h.rel) != any(lq) {
			err = ErrLost
		} else {
			err = h.rel.(reenterer).reenter(h)
		}
		if err != nil {
			e.unref(pfx, lq)
			return nil, err
		}
		return h, errReentered
	}
	if err := context.Cause(ctx); err != nil {
		e.unref(pfx, lq)
		return nil, err
	}
	actx, cancel := budget(ctx, spec.Wait)
	defer cancel()
	var h *Hold
	switch q := lq.(type) {
	case *Queue:
		h, _, err = q.acquireTurn(actx, spec.Wait == 0, nil)
	case *sharedQueue:
		h, err = q.acquire(actx, spec.Wait == 0)
	case *semQueue:
		h, err = q.acquire(actx, spec.Limit, spec.Wait == 0)
	default:
		err = fmt.Errorf("lock: %s is not a prefix of mode %d", pfx, spec.Mode)
	}
	if err != nil {
		e.unref(pfx, lq)
		return nil, err
	}
	return h, nil
}

// reenterer is a queue whose holds are reentrant.
type reenterer interface{ reenter(h *Hold) error }

// checkMode refuses an acquisition of one mode of a read-write lock by a
// ctx that holds the other: it would wait for itself.
func (e *Engine) checkMode(ctx context.Context, spec Spec) error {
	other := ""
	switch spec.Mode {
	case Exclusive:
		other = spec.Prefix + keys.SharedDir
	case Shared:
		other = spec.Prefix
	default:
		return nil
	}
	if _, ok := ctx.Value(holderKey{e, other}).(*Hold); ok {
		return ErrModeHeld
	}
	return nil
}

// QueueCount is how many lock queues the engine keeps (tests: an idle
// process keeps none).
func (e *Engine) QueueCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.queues)
}

// LocalWaiters is the number of this process's goroutines queued for the
// lock under pfx (an exclusive or semaphore prefix; tests observe queueing
// with it instead of sleeping).
func (e *Engine) LocalWaiters(pfx string) int {
	switch q := e.lookup(pfx).(type) {
	case *Queue:
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.waiters.Len()
	case *semQueue:
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.waiters.Len()
	}
	return 0
}

// Describe describes this process's queue of the lock under pfx (tests).
func (e *Engine) Describe(pfx string) string {
	q, ok := e.lookup(pfx).(*Queue)
	if !ok {
		return "no queue"
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	s := fmt.Sprintf("retain=%v busy=%v holder=%v waiters=%d", q.retain, q.busy, q.holder != nil, q.waiters.Len())
	if q.own != nil {
		s += fmt.Sprintf(" own=%s@%d yielding=%v pins=%d err=%v", q.own.key, q.own.rev, q.own.yielding, q.own.pins, q.own.ctx.Err())
	}
	return s
}

// SharedJoinable reports whether a shared acquisition of the lock under
// lockPfx would join this process's open shared key now (tests: a writer
// queued behind it closes it).
func (e *Engine) SharedJoinable(lockPfx string) bool {
	q, ok := e.lookup(lockPfx + keys.SharedDir).(*sharedQueue)
	if !ok {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.open != nil && q.admitsLocked(q.open)
}
