package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The etcd side of a lock is concurrency.Mutex's key protocol: each waiting
// session puts one key pfx+<lease id> bound to its lease; keys are served in
// create-revision order; each waiter watches only its predecessor. Three
// things differ from concurrency.Mutex:
//
//   - The predecessor is watched so that the watch is "synced" in etcd. A
//     watch whose start revision is at or below the store's current revision
//     when it is registered is "unsynced" and is caught up only every 100 ms
//     (watchable_store.go), so the stock Mutex, which watches from the
//     revision it read, stalls up to 100 ms per handoff. Watching from the
//     read revision + 1 is not enough either: any write between the read and
//     the watch's registration (the predecessor's own delete, or unrelated
//     traffic under load) makes that start revision old too. So the watch
//     starts at the current revision (start revision 0, always synced), and
//     its created notification says which revision that is: if anything was
//     written since the read, one Get tells whether the predecessor is
//     already gone.
//   - Every delete is a Txn guarded by the key's create revision, so a late
//     or repeated delete never removes a newer key of the same session
//     (etcd issue 22082).
//   - The wait ends with ErrSessionLost as soon as the session does (etcd
//     issue 19597), and every wait step re-checks that our own key still
//     exists with the revision we put it at.

// errAborted ends a wait whose caller no longer needs the lock (its request
// was served by another goroutine).
var errAborted = errors.New("coordinator: wait aborted")

// lockKey puts this session's key under pfx and waits until it is the
// oldest. With noWait it returns ErrLocked instead of waiting. On error no
// key is left behind (or, if etcd cannot be reached, its removal is retried
// in the background until the session ends).
func (c *Coordinator) lockKey(ctx context.Context, sess *concurrency.Session, pfx string, noWait bool) (*ownership, error) {
	key := pfx + strconv.FormatInt(int64(sess.Lease()), 16)
	myRev, ownerRev, err := c.putWaiterKey(ctx, sess, pfx, key)
	if err != nil {
		// A wait budget (ErrLocked) or the caller's cancellation that ended
		// the put is the reason to report, not the RPC's deadline error.
		if cause := context.Cause(ctx); cause != nil {
			return nil, cause
		}
		return nil, err
	}
	if ownerRev != myRev {
		if noWait {
			_ = c.removeKey(c.bgCtx, sess, key, myRev)
			return nil, ErrLocked
		}
		if err := c.waitPredecessors(ctx, sess, pfx, key, myRev); err != nil {
			_ = c.removeKey(c.bgCtx, sess, key, myRev)
			return nil, err
		}
	}
	octx, cancel := context.WithCancelCause(context.Background())
	return &ownership{sess: sess, key: key, rev: myRev, acquired: time.Now(), ctx: octx, cancel: cancel}, nil
}

// putWaiterKey puts key under the session's lease and returns its create
// revision and the create revision of the oldest key under pfx, in one
// round trip. A key of ours left over from a failed delete is removed first:
// reusing it would hand its old fencing token to a new holder.
func (c *Coordinator) putWaiterKey(ctx context.Context, sess *concurrency.Session, pfx, key string) (myRev, ownerRev int64, err error) {
	for attempt := 0; attempt < 3; attempt++ {
		resp, err := c.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, "", clientv3.WithLease(sess.Lease())),
				clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			// The put may or may not have been applied: clean up by reading.
			c.removeUnknownKey(sess, key)
			return 0, 0, fmt.Errorf("put lock key %s: %w", key, sessionErr(sess, err))
		}
		if !resp.Succeeded {
			stale := resp.Responses[0].GetResponseRange().Kvs
			if len(stale) > 0 {
				if err := c.removeKey(ctx, sess, key, stale[0].CreateRevision); err != nil {
					return 0, 0, err
				}
			}
			continue
		}
		owner := resp.Responses[1].GetResponseRange().Kvs
		return resp.Header.Revision, owner[0].CreateRevision, nil
	}
	return 0, 0, fmt.Errorf("put lock key %s: a stale key of this session keeps reappearing", key)
}

// waitPredecessors waits until no key under pfx is older than myRev.
func (c *Coordinator) waitPredecessors(ctx context.Context, sess *concurrency.Session, pfx, key string, myRev int64) error {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(sess.Ctx(), func() { cancel(ErrSessionLost) })
	defer stop()

	predecessor := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(myRev-1))
	for {
		resp, err := c.client.Txn(wctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", myRev)).
			Then(clientv3.OpGet(pfx, predecessor...)).
			Commit()
		if err != nil {
			return waitErr(wctx, err)
		}
		if !resp.Succeeded {
			// Our key is gone: only its lease's end removes it.
			return ErrSessionLost
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil
		}
		if err := c.waitDelete(wctx, string(kvs[0].Key), resp.Header.Revision); err != nil {
			return waitErr(wctx, err)
		}
	}
}

// waitDelete returns when key, which existed at revision readRev, is
// deleted, or when the watch ends in a way that calls for re-reading (e.g.
// compaction).
func (c *Coordinator) waitDelete(ctx context.Context, key string, readRev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	created := false
	for wr := range c.client.Watch(wctx, key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify()) {
		if wr.CompactRevision != 0 {
			return nil // the caller re-reads the predecessor
		}
		if err := wr.Err(); err != nil {
			return err
		}
		if wr.Created && !created {
			created = true
			if wr.Header.Revision > readRev {
				// Something was written since the read: the delete may be
				// among it, before the watch's start.
				resp, err := c.client.Get(wctx, key, clientv3.WithCountOnly())
				if err != nil {
					return err
				}
				if resp.Count == 0 {
					return nil
				}
			}
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// The watch channel closed without an error: let the caller re-read,
	// after a pause so that a failing connection does not spin.
	select {
	case <-time.After(50 * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitErr turns an error of a wait under wctx into the error to report:
// the session's loss, the caller's ctx cause, or err itself.
func waitErr(wctx context.Context, err error) error {
	if cause := context.Cause(wctx); cause != nil {
		return cause
	}
	return err
}

// sessionErr reports a failed round trip as ErrSessionLost when the session
// ended meanwhile (the likely reason for the failure).
func sessionErr(sess *concurrency.Session, err error) error {
	if isDone(sess.Done()) || errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("%w: %w", ErrSessionLost, err)
	}
	return err
}

// removeKey deletes key if its create revision is still rev; ctx bounds the
// first attempt. If it fails, the delete is retried in the background until
// it succeeds or the session ends (which removes the key anyway), and the
// first error is returned.
func (c *Coordinator) removeKey(ctx context.Context, sess *concurrency.Session, key string, rev int64) error {
	err := c.deleteGuarded(ctx, key, rev)
	if err == nil || isDone(sess.Done()) {
		return nil
	}
	c.log.Warn("lock key not deleted; retrying in the background", "key", key, "err", err)
	c.goBackground(func(ctx context.Context) {
		backoff := 100 * time.Millisecond
		for {
			select {
			case <-time.After(backoff):
			case <-sess.Done():
				return
			case <-ctx.Done():
				return
			}
			if c.deleteGuarded(ctx, key, rev) == nil {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	})
	return fmt.Errorf("delete lock key %s: %w", key, err)
}

func (c *Coordinator) deleteGuarded(ctx context.Context, key string, rev int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.releaseTimeout)
	defer cancel()
	_, err := c.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key)).
		Commit()
	return err
}

// removeUnknownKey removes key after a put whose outcome is unknown: it reads
// the key's revision and deletes it guarded by that revision. Only the
// goroutine with the queue's turn uses key now, so whatever is there is ours
// from this attempt. A failure leaves the key to the next acquisition (which
// removes stale keys first) or to the session's end.
func (c *Coordinator) removeUnknownKey(sess *concurrency.Session, key string) {
	if isDone(sess.Done()) {
		return
	}
	ctx, cancel := context.WithTimeout(c.bgCtx, c.opts.releaseTimeout)
	defer cancel()
	resp, err := c.client.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return
	}
	_ = c.removeKey(ctx, sess, key, resp.Kvs[0].CreateRevision)
}
