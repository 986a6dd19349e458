package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/keys"
)

// Coordinator is a process's handle on stockctl's locks and stock. Create one
// per etcd client and share it between all goroutines: it owns one etcd
// session (a lease renewed in the background) under which every lock of this
// process is held, and it queues this process's goroutines locally so that
// only one of them at a time owns a lock's etcd key.
//
// When the session is lost, every lock held under it is marked lost and
// every waiter fails with ErrSessionLost; the next call starts a new session.
type Coordinator struct {
	client *clientv3.Client
	// kv is client's KV through etcdcall: no call sends its caller's
	// deadline to the server, so that the end of a wait budget or of the
	// caller's ctx is recognised whatever the server answers (etcd 3.4
	// answers an expired deadline with an error of its own).
	kv   clientv3.KV
	keys keys.Space
	opts options
	log  *slog.Logger

	// sessSem serialises session creation without holding mu across the
	// Grant round trip, and lets a waiter give up when its ctx ends.
	sessSem chan struct{}

	mu     sync.Mutex
	sess   *concurrency.Session // nil when there is none yet or it was lost
	closed bool
	queues map[string]*lockQueue // by lock key prefix; entries live while referenced

	// bg tracks background goroutines (session watchers, key cleanup) so
	// that Close returns only when none is left.
	bg     sync.WaitGroup
	bgCtx  context.Context
	bgStop context.CancelFunc

	stock stockState

	// metrics is nil without WithMetrics: its methods then do nothing.
	metrics *metrics
}

// New returns a coordinator using client. The client stays the caller's: Close
// the coordinator before the client. No etcd call is made until the first
// lock or stock operation.
func New(client *clientv3.Client, opts ...Option) (*Coordinator, error) {
	if client == nil {
		return nil, fmt.Errorf("coordinator: client is nil: %w", ErrInvalidArgument)
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("coordinator: %w: %w", ErrInvalidArgument, err)
		}
	}
	space, err := keys.New(o.prefix)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w: %w", ErrInvalidArgument, err)
	}
	bgCtx, bgStop := context.WithCancel(context.Background())
	c := &Coordinator{
		client:  client,
		kv:      etcdcall.KV(client),
		keys:    space,
		opts:    o,
		log:     o.logger,
		sessSem: make(chan struct{}, 1),
		queues:  make(map[string]*lockQueue),
		bgCtx:   bgCtx,
		bgStop:  bgStop,
	}
	c.stock.init()
	if o.metrics != nil {
		c.metrics = newMetrics(c)
		if err := o.metrics.Register(c.metrics); err != nil {
			bgStop()
			return nil, fmt.Errorf("coordinator: register metrics: %w", err)
		}
	}
	return c, nil
}

// Client is the etcd client the coordinator uses.
func (c *Coordinator) Client() *clientv3.Client { return c.client }

// KV is the coordinator's view of the client's KV: no call made through it
// sends its caller's deadline to the server (it is cancelled when the
// caller's ctx ends instead), and the end of the caller's ctx reads as the
// ctx's cause whatever the server answered. Packages that build on the
// coordinator use it for their own reads and fenced writes.
func (c *Coordinator) KV() clientv3.KV { return c.kv }

// Prefix is the etcd key prefix the coordinator works under.
func (c *Coordinator) Prefix() string { return c.keys.Prefix() }

// Keys is the coordinator's key space (for packages of this module).
func (c *Coordinator) Keys() keys.Space { return c.keys }

// SessionTTL is the lease TTL of the coordinator's sessions.
func (c *Coordinator) SessionTTL() time.Duration { return c.opts.sessionTTL }

// Session returns the coordinator's current etcd session, starting one if
// there is none. ctx bounds the lease grant. Packages that build on the
// coordinator (the rebalancer's election) use it so that everything a
// process holds shares one lease.
func (c *Coordinator) Session(ctx context.Context) (*concurrency.Session, error) {
	return c.session(ctx)
}

// Close releases every lock, revokes the session's lease and waits for the
// coordinator's background goroutines to end. Locks held at Close are lost
// (their cause is ErrClosed); waiters fail with ErrClosed. Close is
// idempotent. It does not close the etcd client.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sess := c.sess
	c.sess = nil
	c.mu.Unlock()

	var err error
	if sess != nil {
		// Revoking the lease deletes every key this process holds in one
		// step; the session watcher then marks local holds lost.
		err = sess.Close()
		c.sessionEnded(sess)
	}
	// Stop under mu: goBackground adds to bg under mu only while bgCtx is
	// live, so no Add can follow the Wait below.
	c.mu.Lock()
	c.bgStop()
	c.mu.Unlock()
	c.bg.Wait()
	if c.metrics != nil {
		c.opts.metrics.Unregister(c.metrics)
	}
	if err != nil {
		return fmt.Errorf("coordinator: close: revoke lease: %w", err)
	}
	return nil
}

// session returns the live session, creating one if needed.
func (c *Coordinator) session(ctx context.Context) (*concurrency.Session, error) {
	if s, err := c.liveSession(); s != nil || err != nil {
		return s, err
	}
	select {
	case c.sessSem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("coordinator: start session: %w", context.Cause(ctx))
	}
	defer func() { <-c.sessSem }()
	if s, err := c.liveSession(); s != nil || err != nil {
		return s, err
	}

	// Grant with the caller's ctx: concurrency.NewSession would grant with
	// the client's ctx, which no caller can bound.
	ttl := int64(c.opts.sessionTTL / time.Second)
	var lease *clientv3.LeaseGrantResponse
	err := etcdcall.Run(ctx, func(ctx context.Context) (err error) {
		lease, err = c.client.Grant(ctx, ttl)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator: start session: grant lease: %w", err)
	}
	s, err := concurrency.NewSession(c.client, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(ttl)))
	if err != nil {
		c.revokeInBackground(lease.ID)
		return nil, fmt.Errorf("coordinator: start session: keep lease alive: %w", err)
	}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = s.Close()
		return nil, ErrClosed
	}
	c.sess = s
	c.bg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.bg.Done()
		select {
		case <-s.Done():
			c.sessionEnded(s)
		case <-c.bgCtx.Done():
		}
	}()
	c.log.Debug("session started", "lease", fmt.Sprintf("%x", int64(s.Lease())), "ttl", c.opts.sessionTTL)
	c.metrics.sessionStarted()
	c.watchRenewals(s)
	return s, nil
}

func (c *Coordinator) liveSession() (*concurrency.Session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.sess == nil {
		return nil, nil
	}
	select {
	case <-c.sess.Done():
		return nil, nil
	default:
		return c.sess, nil
	}
}

// sessionEnded marks everything held or awaited under s as lost. It runs
// once s.Done() is closed, so any acquisition that checks s.Done() after
// taking its queue's mutex sees the loss too.
func (c *Coordinator) sessionEnded(s *concurrency.Session) {
	c.mu.Lock()
	if c.sess == s {
		c.sess = nil
	}
	closed := c.closed
	qs := make([]*lockQueue, 0, len(c.queues))
	for _, q := range c.queues {
		qs = append(qs, q)
	}
	c.mu.Unlock()

	cause := ErrLockLost
	waitCause := ErrSessionLost
	if closed {
		cause, waitCause = ErrClosed, ErrClosed
	}
	for _, q := range qs {
		q.sessionLost(s, cause, waitCause)
	}
	if !closed {
		c.metrics.sessionLost()
		c.log.Warn("etcd session lost; locks held under it are lost", "lease", fmt.Sprintf("%x", int64(s.Lease())))
		// The lease is normally gone already; if only this client stopped
		// renewing it, revoking frees our keys for others now, not at expiry.
		c.revokeInBackground(s.Lease())
	}
}

// watchRenewals reports keepalives of s answered late: more than half the
// TTL after the previous one (they are sent every third of it), so that a
// struggling etcd or a starved process shows before the session is lost.
// It listens on a second keepalive channel of the same lease; the client
// sends one keepalive per lease whatever the number of listeners.
func (c *Coordinator) watchRenewals(s *concurrency.Session) {
	ch, err := c.client.KeepAlive(s.Ctx(), s.Lease())
	if err != nil {
		return // the session's own keepalive reports the trouble
	}
	c.goBackground(func(ctx context.Context) {
		late := c.opts.sessionTTL / 2
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
				c.metrics.lateRenewal()
				c.log.Warn("etcd session renewed late", "lease", fmt.Sprintf("%x", int64(s.Lease())),
					"since_last", gap.Round(time.Millisecond), "ttl", c.opts.sessionTTL)
			}
			last = now
		}
	})
}

func (c *Coordinator) revokeInBackground(id clientv3.LeaseID) {
	c.goBackground(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, c.opts.releaseTimeout)
		defer cancel()
		if err := etcdcall.Run(ctx, func(ctx context.Context) error {
			_, err := c.client.Revoke(ctx, id)
			return err
		}); err != nil {
			c.log.Debug("revoke of a lost lease failed; it expires by itself", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
		}
	})
}

// goBackground runs f in a goroutine tracked by Close. f's ctx ends at
// Close. It reports false, running nothing, once Close has begun.
func (c *Coordinator) goBackground(f func(ctx context.Context)) bool {
	c.mu.Lock()
	if c.bgCtx.Err() != nil {
		c.mu.Unlock()
		return false
	}
	c.bg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.bg.Done()
		f(c.bgCtx)
	}()
	return true
}

// queue returns the lock queue for a key prefix with a reference taken; the
// caller must drop it with unref.
func (c *Coordinator) queue(pfx string) (*lockQueue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	q := c.queues[pfx]
	if q == nil {
		q = &lockQueue{c: c, pfx: pfx, kind: c.lockKind(pfx)}
		c.queues[pfx] = q
	}
	q.refs++
	return q, nil
}

// ref takes one more reference on a queue already referenced (a hold taken
// without lockPrefix: its unlock drops one).
func (c *Coordinator) ref(q *lockQueue) {
	c.mu.Lock()
	q.refs++
	c.mu.Unlock()
}

// unref drops a reference taken by queue; an unreferenced queue is idle (no
// holder, no waiter) and is forgotten.
func (c *Coordinator) unref(q *lockQueue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q.refs--
	if q.refs == 0 && c.queues[q.pfx] == q {
		delete(c.queues, q.pfx)
	}
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
