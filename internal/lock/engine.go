package lock

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/etcdcall"
)

// Config is what an Engine needs to know. The coordinator fills it from its
// options (and documents each default there).
type Config struct {
	// SessionTTL is the lease TTL, a whole number of seconds.
	SessionTTL time.Duration
	// CohortMaxHandoffs and CohortMaxHold bound local handoffs of a lock that
	// is not retained (CohortMaxHandoffs at most MaxCohortHandoffs).
	CohortMaxHandoffs int
	CohortMaxHold     time.Duration
	// ReleaseTimeout bounds each attempt to delete a key in cleanup.
	ReleaseTimeout time.Duration
	// TenureIdle is how long a retained queue keeps an unused key.
	TenureIdle time.Duration
	// LockDelay, if positive, is the lock-delay of the named locks and
	// semaphores this engine acquires (delay.go).
	LockDelay time.Duration
	// WatchPrefixes are the prefixes of the named locks' keys: one watch
	// over each tells held locks that their keys were deleted (keywatch.go).
	WatchPrefixes []string
	Logger        *slog.Logger
	// Metrics, if not nil, counts waits, holds, handoffs and sessions.
	Metrics *Metrics
	// Identity is the value of every lock key this engine puts: who holds
	// (coordinator.WithIdentity).
	Identity string
}

// Engine is one process's lock engine: its etcd session and its queues.
type Engine struct {
	client  *clientv3.Client
	kv      clientv3.KV // through etcdcall: no caller's deadline reaches etcd
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	bg      *background.Group

	// sessSem serialises session creation without holding mu across the
	// Grant round trip, and lets a waiter give up when its ctx ends.
	sessSem chan struct{}

	seq      atomic.Int64 // numbers the keys a session may have several of
	renewals atomic.Int64 // keepalive answers seen (tests)

	mu   sync.Mutex // guards sess, queues, every queue's refs, and kw; closed is set under it
	sess *concurrency.Session
	// closed is set once, by Close, under mu; an atomic so that readers
	// under a queue's mu, which may not take mu (the lock order), see it
	// too (keyGoneAtClose).
	closed atomic.Bool
	queues map[string]lockQueue // by key prefix; entries live while referenced
	kw     keyWatch
}

// lockQueue is what the engine asks of every kind of queue: the exclusive
// and retained Queue, the shared queue of a read-write lock, a semaphore's.
type lockQueue interface {
	// sessionLost marks what is held or awaited under s lost.
	sessionLost(s *concurrency.Session, holdCause, waitCause error)
	// keyGone is told that key was deleted at revision rev (keywatch.go).
	keyGone(key string, rev int64)
	// keyInUse reports whether the queue owns key at create revision rev,
	// or is between states and might (scrubKey waits for its next look).
	keyInUse(key string, rev int64) bool
	// owned lists the keys the queue holds that the key watch covers.
	owned() []*Ownership
	refs() *int
}

// qbase is the part of every queue the engine keeps.
type qbase struct {
	n int // references; guarded by Engine.mu
}

func (b *qbase) refs() *int { return &b.n }

// New returns an engine that makes its calls through kv (the client's KV
// wrapped by etcdcall) and runs its background work in bg. No etcd call is
// made until the first lock.
func New(client *clientv3.Client, kv clientv3.KV, bg *background.Group, cfg Config) *Engine {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Engine{
		client:  client,
		kv:      kv,
		cfg:     cfg,
		log:     cfg.Logger,
		metrics: cfg.Metrics,
		bg:      bg,
		sessSem: make(chan struct{}, 1),
		queues:  make(map[string]lockQueue),
	}
}

// Close marks the engine closed and revokes the session's lease, which
// deletes every key this process holds in one step; holds are lost with
// cause ErrClosed and waiters fail with ErrClosed. It reports whether the
// engine was open (a second Close does nothing) and the revoke's error. The
// caller stops the background group afterwards.
func (e *Engine) Close() (bool, error) {
	e.mu.Lock()
	if e.closed.Load() {
		e.mu.Unlock()
		return false, nil
	}
	e.closed.Store(true)
	sess := e.sess
	e.sess = nil
	e.mu.Unlock()
	if sess == nil {
		return true, nil
	}
	err := sess.Close()
	e.sessionEnded(sess)
	return true, err
}

// keyGoneAtClose reports whether a key of this process found gone should
// be left to Close. Close revokes the session's lease, which deletes every
// key of the process, and only then ends the holds (with ErrClosed); a
// watch of those keys sees the deletions meanwhile. The engine's own watch
// ignores them once closed (keyEvent); the segment engine's watch of its
// tenures' keys did not, and each Close logged every tenure as "lock lost:
// its etcd key is gone" and ended it with ErrLost rather than ErrClosed
// (TestCloseWarnsOfNoLostLock). Every queue asks here, whoever tells it.
func (e *Engine) keyGoneAtClose() bool { return e.closed.Load() }

// SessionTTL is the lease TTL of the engine's sessions.
func (e *Engine) SessionTTL() time.Duration { return e.cfg.SessionTTL }

// Lease is the ID of the live session's lease, 0 when there is none.
func (e *Engine) Lease() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sess == nil {
		return 0
	}
	return int64(e.sess.Lease())
}

// ref returns the queue under pfx with a reference taken, making it with
// mk if there is none.
func (e *Engine) ref(pfx string, mk func() lockQueue) (lockQueue, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return nil, ErrClosed
	}
	q := e.queues[pfx]
	if q == nil {
		q = mk()
		e.queues[pfx] = q
	}
	*q.refs()++
	return q, nil
}

// unref drops a reference; an unreferenced queue is idle (no holder, no
// waiter) and is forgotten.
func (e *Engine) unref(pfx string, q lockQueue) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if *q.refs()--; *q.refs() == 0 && e.queues[pfx] == q {
		delete(e.queues, pfx)
	}
}

// lookup returns the queue under pfx, if any, without a reference.
func (e *Engine) lookup(pfx string) lockQueue {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.queues[pfx]
}

// Queue returns the exclusive (or retained) queue of the lock whose keys
// live under pfx, with a reference taken: drop it with Unref (a hold's
// Unlock drops the reference its acquisition took). kind is the lock's
// metrics label (KindNamed, KindSegment, KindPool).
func (e *Engine) Queue(pfx, kind string) (*Queue, error) {
	lq, err := e.ref(pfx, func() lockQueue { return &Queue{e: e, pfx: pfx, kind: kind} })
	if err != nil {
		return nil, err
	}
	q, ok := lq.(*Queue)
	if !ok {
		e.unref(pfx, lq)
		return nil, fmt.Errorf("lock: %s is not an exclusive lock's prefix", pfx)
	}
	return q, nil
}

// Ref takes one more reference on a queue already referenced.
func (e *Engine) Ref(q *Queue) {
	e.mu.Lock()
	q.n++
	e.mu.Unlock()
}

// Unref drops a reference taken by Queue or Ref.
func (e *Engine) Unref(q *Queue) { e.unref(q.pfx, q) }

// Acquire takes the exclusive lock whose keys live under pfx, without a
// lock-delay (AcquireNamed has the rest). wait < 0 waits as long as ctx
// allows; wait >= 0 is a TryLock budget (0: one attempt, no wait), whose
// end is ErrLocked. A ctx carrying a hold of the same lock re-enters it. On
// failure nothing is left in the queue or in etcd on the caller's behalf
// (the process's key stays while other goroutines of it still wait for the
// lock: acquisition.go).
func (e *Engine) Acquire(ctx context.Context, pfx, kind string, wait time.Duration) (*Hold, error) {
	return e.AcquireNamed(ctx, Spec{Mode: Exclusive, Prefix: pfx, Kind: kind, Wait: wait})
}

// budget bounds an acquisition by its wait: a budget, not a deadline: etcd
// must never answer for it (see etcdcall), and its end must read as
// ErrLocked.
func budget(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	if wait > 0 {
		return etcdcall.Budget(ctx, wait, ErrLocked)
	}
	return ctx, func() {}
}

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
