package lock

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/etcdcall"
)

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
	if e.closed.Load() {
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
	granted := time.Duration(lease.TTL) * time.Second
	e.log.Debug("session started", "lease", fmt.Sprintf("%x", int64(s.Lease())), "ttl", e.cfg.SessionTTL, "granted_ttl", granted)
	e.metrics.sessionStarted()
	e.watchRenewals(s, granted)
	return s, nil
}

func (e *Engine) liveSession() (*concurrency.Session, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
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
	closed := e.closed.Load()
	qs := make([]lockQueue, 0, len(e.queues))
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

// clientKeepAliveTick is how often etcd's client looks for leases due for a
// keepalive (retryConnWait in client/v3's lease.go): it sends one at the
// first tick after a third of the TTL has passed since the last answer. So
// on a healthy cluster answers come every TTL/3 to TTL/3 + one tick, plus a
// round trip.
const clientKeepAliveTick = 500 * time.Millisecond

// lateAfter is the gap between two keepalive answers that counts as late
// for a lease whose granted TTL is ttl: halfway between the longest gap of a
// healthy client (ttl/3 + one tick) and the TTL, when the lease expires.
// For etcd's minimum TTL of 2 s that is 1.58 s; for 10 s, 6.9 s.
func lateAfter(ttl time.Duration) time.Duration {
	healthy := ttl/3 + clientKeepAliveTick
	return healthy + max(ttl-healthy, 0)/2
}

// watchRenewals reports keepalives of s answered late (see lateAfter), so
// that a struggling etcd or a starved process shows before the session is
// lost. Lateness is judged against the TTL etcd granted (a server raises
// TTLs below its minimum, and a new leader may change them), updated from
// every answer, not the TTL asked for. It listens on a second keepalive
// channel of the same lease; the client sends one keepalive per lease
// whatever the number of listeners.
func (e *Engine) watchRenewals(s *concurrency.Session, granted time.Duration) {
	ch, err := e.client.KeepAlive(s.Ctx(), s.Lease())
	if err != nil {
		return // the session's own keepalive reports the trouble
	}
	e.bg.Go(func(ctx context.Context) {
		ttl := granted
		last := time.Now()
		for {
			var resp *clientv3.LeaseKeepAliveResponse
			select {
			case r, ok := <-ch:
				if !ok {
					return
				}
				resp = r
			case <-ctx.Done():
				return
			}
			now := time.Now()
			e.renewals.Add(1)
			if gap := now.Sub(last); gap > lateAfter(ttl) {
				e.metrics.lateRenewal()
				e.log.Warn("etcd session renewed late", "lease", fmt.Sprintf("%x", int64(s.Lease())),
					"since_last", gap.Round(time.Millisecond), "late_after", lateAfter(ttl), "granted_ttl", ttl)
			}
			if resp.TTL > 0 {
				ttl = time.Duration(resp.TTL) * time.Second
			}
			last = now
		}
	})
}

// retireSession ends sess, whose lease etcd says is gone, at once: the
// next Session call starts a new one, and Orphan stops its keepalive, which
// closes its Done and so runs sessionEnded (every hold under it lost, its
// waiters failed).
func (e *Engine) retireSession(sess *concurrency.Session) {
	e.mu.Lock()
	if e.sess == sess {
		e.sess = nil
	}
	e.mu.Unlock()
	sess.Orphan()
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
