package lock

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
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
	// is not retained.
	CohortMaxHandoffs int
	CohortMaxHold     time.Duration
	// ReleaseTimeout bounds each attempt to delete a key in cleanup.
	ReleaseTimeout time.Duration
	// TenureIdle is how long a retained queue keeps an unused key.
	TenureIdle time.Duration
	Logger     *slog.Logger
	// Metrics, if not nil, counts waits, handoffs and sessions.
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

	mu     sync.Mutex // guards sess, closed, queues and every Queue's refs
	sess   *concurrency.Session
	closed bool
	queues map[string]*Queue // by key prefix; entries live while referenced
}

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
		queues:  make(map[string]*Queue),
	}
}

// Close marks the engine closed and revokes the session's lease, which
// deletes every key this process holds in one step; holds are lost with
// cause ErrClosed and waiters fail with ErrClosed. It reports whether the
// engine was open (a second Close does nothing) and the revoke's error. The
// caller stops the background group afterwards.
func (e *Engine) Close() (bool, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return false, nil
	}
	e.closed = true
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

// Session returns the live session, starting one if there is none. ctx
// bounds the lease grant. Everything a process holds shares this lease (the
// rebalancer's election too).
func (e *Engine) Session(ctx context.Context) (*concurrency.Session, error) {
	if s, err := e.liveSession(); s != nil || err != nil {
		return s, err
	}
	select {
	case e.sessSem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("coordinator: start session: %w", context.Cause(ctx))
	}
	defer func() { <-e.sessSem }()
	if s, err := e.liveSession(); s != nil || err != nil {
		return s, err
	}

	// Grant with the caller's ctx: concurrency.NewSession would grant with
	// the client's ctx, which no caller can bound.
	ttl := int64(e.cfg.SessionTTL / time.Second)
	var lease *clientv3.LeaseGrantResponse
	err := etcdcall.Run(ctx, func(ctx context.Context) (err error) {
		lease, err = e.client.Grant(ctx, ttl)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator: start session: grant lease: %w", err)
	}
	s, err := concurrency.NewSession(e.client, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(ttl)))
	if err != nil {
		e.revokeInBackground(lease.ID)
		return nil, fmt.Errorf("coordinator: start session: keep lease alive: %w", err)
	}

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		_ = s.Close()
		return nil, ErrClosed
	}
	e.sess = s
	e.mu.Unlock()
	if !e.bg.Go(func(ctx context.Context) {
		select {
		case <-s.Done():
			e.sessionEnded(s)
		case <-ctx.Done():
		}
	}) {
		_ = s.Close()
		return nil, ErrClosed
	}
	e.log.Debug("session started", "lease", fmt.Sprintf("%x", int64(s.Lease())), "ttl", e.cfg.SessionTTL)
	e.metrics.sessionStarted()
	e.watchRenewals(s)
	return s, nil
}

func (e *Engine) liveSession() (*concurrency.Session, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if e.sess == nil {
		return nil, nil
	}
	select {
	case <-e.sess.Done():
		return nil, nil
	default:
		return e.sess, nil
	}
}

// sessionEnded marks everything held or awaited under s as lost. It runs
// once s.Done() is closed, so any acquisition that checks s.Done() after
// taking its queue's mutex sees the loss too.
func (e *Engine) sessionEnded(s *concurrency.Session) {
	e.mu.Lock()
	if e.sess == s {
		e.sess = nil
	}
	closed := e.closed
	qs := make([]*Queue, 0, len(e.queues))
	for _, q := range e.queues {
		qs = append(qs, q)
	}
	e.mu.Unlock()

	cause, waitCause := ErrLost, ErrSessionLost
	if closed {
		cause, waitCause = ErrClosed, ErrClosed
	}
	for _, q := range qs {
		q.sessionLost(s, cause, waitCause)
	}
	if !closed {
		e.metrics.sessionLost()
		e.log.Warn("etcd session lost; locks held under it are lost", "lease", fmt.Sprintf("%x", int64(s.Lease())))
		// The lease is normally gone already; if only this client stopped
		// renewing it, revoking frees our keys for others now, not at expiry.
		e.revokeInBackground(s.Lease())
	}
}

// watchRenewals reports keepalives of s answered late: more than half the
// TTL after the previous one (they are sent every third of it), so that a
// struggling etcd or a starved process shows before the session is lost.
// It listens on a second keepalive channel of the same lease; the client
// sends one keepalive per lease whatever the number of listeners.
func (e *Engine) watchRenewals(s *concurrency.Session) {
	ch, err := e.client.KeepAlive(s.Ctx(), s.Lease())
	if err != nil {
		return // the session's own keepalive reports the trouble
	}
	e.bg.Go(func(ctx context.Context) {
		late := e.cfg.SessionTTL / 2
		last := time.Now()
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					return
				}
			case <-ctx.Done():
				return
			}
			now := time.Now()
			if gap := now.Sub(last); gap > late {
				e.metrics.lateRenewal()
				e.log.Warn("etcd session renewed late", "lease", fmt.Sprintf("%x", int64(s.Lease())),
					"since_last", gap.Round(time.Millisecond), "ttl", e.cfg.SessionTTL)
			}
			last = now
		}
	})
}

func (e *Engine) revokeInBackground(id clientv3.LeaseID) {
	e.bg.Go(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, e.cfg.ReleaseTimeout)
		defer cancel()
		if err := etcdcall.Run(ctx, func(ctx context.Context) error {
			_, err := e.client.Revoke(ctx, id)
			return err
		}); err != nil {
			e.log.Debug("revoke of a lost lease failed; it expires by itself", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
		}
	})
}

// Queue returns the queue of the lock whose keys live under pfx, with a
// reference taken: drop it with Unref (a hold's Unlock drops the reference
// its acquisition took). kind is the lock's metrics label (KindNamed,
// KindSegment, KindPool).
func (e *Engine) Queue(pfx, kind string) (*Queue, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	q := e.queues[pfx]
	if q == nil {
		q = &Queue{e: e, pfx: pfx, kind: kind}
		e.queues[pfx] = q
	}
	q.refs++
	return q, nil
}

// Ref takes one more reference on a queue already referenced.
func (e *Engine) Ref(q *Queue) {
	e.mu.Lock()
	q.refs++
	e.mu.Unlock()
}

// Unref drops a reference; an unreferenced queue is idle (no holder, no
// waiter) and is forgotten.
func (e *Engine) Unref(q *Queue) {
	e.mu.Lock()
	defer e.mu.Unlock()
	q.refs--
	if q.refs == 0 && e.queues[q.pfx] == q {
		delete(e.queues, q.pfx)
	}
}

// Acquire takes the lock whose keys live under pfx. wait < 0 waits as long
// as ctx allows; wait >= 0 is a TryLock budget (0: one attempt, no wait),
// whose end is ErrLocked. A ctx carrying a hold of the same lock re-enters
// it. On failure nothing is left in the queue or in etcd.
func (e *Engine) Acquire(ctx context.Context, pfx, kind string, wait time.Duration) (*Hold, error) {
	q, err := e.Queue(pfx, kind)
	if err != nil {
		return nil, err
	}
	if h, ok := ctx.Value(holderKey{e, pfx}).(*Hold); ok {
		if h.q != q {
			e.Unref(q)
			return nil, ErrLost
		}
		if err := q.reenter(h); err != nil {
			e.Unref(q)
			return nil, err
		}
		return h, nil
	}
	if err := context.Cause(ctx); err != nil {
		e.Unref(q)
		return nil, err
	}
	actx := ctx
	if wait > 0 {
		// A budget, not a deadline: etcd must never answer for it (see
		// etcdcall), and its end must read as ErrLocked.
		var cancel context.CancelFunc
		actx, cancel = etcdcall.Budget(ctx, wait, ErrLocked)
		defer cancel()
	}
	h, err := q.Acquire(actx, wait == 0)
	if err != nil {
		e.Unref(q)
		return nil, err
	}
	return h, nil
}

// QueueCount is how many lock queues the engine keeps (tests: an idle
// process keeps none).
func (e *Engine) QueueCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.queues)
}

// LocalWaiters is the number of this process's goroutines queued for the
// lock under pfx (tests observe queueing with it instead of sleeping).
func (e *Engine) LocalWaiters(pfx string) int {
	e.mu.Lock()
	q := e.queues[pfx]
	e.mu.Unlock()
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Len()
}

// Describe describes this process's queue of the lock under pfx (tests).
func (e *Engine) Describe(pfx string) string {
	e.mu.Lock()
	q := e.queues[pfx]
	e.mu.Unlock()
	if q == nil {
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

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
