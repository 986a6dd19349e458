package lock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/stockctl/stockctl/internal/background"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
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

// lockKey puts this session's key under pfx and waits until it is the
// oldest. With noWait it returns ErrLocked instead of waiting. On error no
// key is left behind (or, if etcd cannot be reached, its removal is retried
// in the background until the session ends).
//
// reads, if any, are read in the same transaction as the key's put: their
// answers are returned when the key was the oldest at once (no wait), and
// are then as of the revision the lock was taken (nil otherwise).
func (e *Engine) lockKey(ctx context.Context, sess *concurrency.Session, pfx string, noWait bool, reads []clientv3.Op) (*Ownership, []*pb.ResponseOp, error) {
	key := pfx + strconv.FormatInt(int64(sess.Lease()), 16)
	// The put must not be cut short by the caller's ctx (a wait budget
	// expires all the time under load): a put abandoned in flight may still
	// be applied after the cleanup looked for it, leaving a key under our
	// live, renewed lease that every other process would queue behind
	// forever. So the put runs on its own bounded ctx, and the caller's ctx
	// is checked once its outcome is known.
	pctx, cancelPut := context.WithTimeout(e.bg.Ctx(), e.cfg.ReleaseTimeout)
	myRev, ownerRev, answers, err := e.putWaiterKey(pctx, sess, pfx, key, reads)
	cancelPut()
	if err != nil {
		return nil, nil, err
	}
	if cause := context.Cause(ctx); cause != nil {
		_ = e.removeKey(e.bg.Ctx(), sess, key, myRev)
		return nil, nil, cause
	}
	if ownerRev != myRev {
		answers = nil // as of before the wait: not the holder's
		if noWait {
			_ = e.removeKey(e.bg.Ctx(), sess, key, myRev)
			return nil, nil, ErrLocked
		}
		if err := e.waitPredecessors(ctx, sess, pfx, key, myRev); err != nil {
			_ = e.removeKey(e.bg.Ctx(), sess, key, myRev)
			return nil, nil, err
		}
	}
	octx, cancel := context.WithCancelCause(context.Background())
	return &Ownership{sess: sess, key: key, rev: myRev, acquired: time.Now(), ctx: octx, cancel: cancel}, answers, nil
}

// putWaiterKey puts key under the session's lease and returns its create
// revision and the create revision of the oldest key under pfx, and the
// answers to reads, in one round trip. A key of ours left over from a
// failed delete is removed first: reusing it would hand its old fencing
// token to a new holder.
func (e *Engine) putWaiterKey(ctx context.Context, sess *concurrency.Session, pfx, key string, reads []clientv3.Op) (myRev, ownerRev int64, answers []*pb.ResponseOp, err error) {
	ops := append([]clientv3.Op{clientv3.OpPut(key, e.cfg.Identity, clientv3.WithLease(sess.Lease())),
		clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)}, reads...)
	for attempt := 0; attempt < 3; attempt++ {
		resp, err := e.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(ops...).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			// The put may or may not have been applied: clean up by reading.
			e.scrubKey(sess, pfx, key)
			return 0, 0, nil, fmt.Errorf("put lock key %s: %w", key, sessionErr(sess, err))
		}
		if !resp.Succeeded {
			stale := resp.Responses[0].GetResponseRange().Kvs
			if len(stale) > 0 {
				if err := e.removeKey(ctx, sess, key, stale[0].CreateRevision); err != nil {
					return 0, 0, nil, err
				}
			}
			continue
		}
		owner := resp.Responses[1].GetResponseRange().Kvs
		return resp.Header.Revision, owner[0].CreateRevision, resp.Responses[2:], nil
	}
	return 0, 0, nil, fmt.Errorf("put lock key %s: a stale key of this session keeps reappearing", key)
}

// waitPredecessors waits until no key under pfx is older than myRev.
func (e *Engine) waitPredecessors(ctx context.Context, sess *concurrency.Session, pfx, key string, myRev int64) error {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(sess.Ctx(), func() { cancel(ErrSessionLost) })
	defer stop()

	predecessor := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(myRev-1))
	for {
		resp, err := e.kv.Txn(wctx).
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
		if err := e.waitDelete(wctx, string(kvs[0].Key), kvs[0].CreateRevision, resp.Header.Revision); err != nil {
			return waitErr(wctx, err)
		}
	}
}

// waitDelete returns when key, which existed at revision readRev with create
// revision createRev, is deleted, or when the watch ends in a way that calls
// for re-reading (e.g. compaction).
//
// Lock keys are named after their session's lease, so the predecessor's
// process may delete its key and put a new one of the same name at once (its
// next turn, queued behind us). That new key is not the one we wait for: a
// key found under the name counts only if its create revision is createRev.
func (e *Engine) waitDelete(ctx context.Context, key string, createRev, readRev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	created := false
	for wr := range e.client.Watch(wctx, key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify()) {
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
				resp, err := e.kv.Get(wctx, key, clientv3.WithKeysOnly())
				if err != nil {
					return err
				}
				if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != createRev {
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
	if !background.Sleep(ctx, 50*time.Millisecond) {
		return ctx.Err()
	}
	return nil
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
// ended meanwhile (the likely reason for the failure). etcd's "lease not
// found" proves the lease is gone: the session is ended at once (Orphan
// stops its keepalive, which closes Done and runs the loss handling), not
// when its keepalive notices, so that the next call starts a new one
// instead of failing the same way.
func sessionErr(sess *concurrency.Session, err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		sess.Orphan()
		return fmt.Errorf("%w: %w", ErrSessionLost, err)
	}
	if isDone(sess.Done()) {
		return fmt.Errorf("%w: %w", ErrSessionLost, err)
	}
	return err
}

// removeKey deletes key if its create revision is still rev; ctx bounds the
// first attempt. If it fails, the delete is retried in the background until
// it succeeds or the session ends (which removes the key anyway), and the
// first error is returned.
func (e *Engine) removeKey(ctx context.Context, sess *concurrency.Session, key string, rev int64) error {
	return e.removeFailed(sess, key, rev, e.deleteGuarded(ctx, key, rev))
}

// removeFailed handles the outcome err of a first attempt to delete key:
// after a failure it retries in the background and returns the error.
func (e *Engine) removeFailed(sess *concurrency.Session, key string, rev int64, err error) error {
	if err == nil || isDone(sess.Done()) {
		return nil
	}
	e.log.Warn("lock key not deleted; retrying in the background", "key", key, "err", err)
	e.bg.Go(func(ctx context.Context) {
		backoff := 100 * time.Millisecond
		for {
			select {
			case <-time.After(backoff):
			case <-sess.Done():
				return
			case <-ctx.Done():
				return
			}
			if e.deleteGuarded(ctx, key, rev) == nil {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	})
	return fmt.Errorf("delete lock key %s: %w", key, err)
}

// releaseKey is removeKey for the key of a hold being unlocked. It also
// reports whether the key was already gone (its lease expired or was
// revoked, or it was deleted) before this process noticed: then the hold
// had been lost, and another process may have held the lock meanwhile.
func (e *Engine) releaseKey(ctx context.Context, sess *concurrency.Session, key string, rev int64) (gone bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, e.cfg.ReleaseTimeout)
	resp, err := e.kv.Txn(dctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key)).
		Commit()
	cancel()
	if err != nil {
		return false, e.removeFailed(sess, key, rev, err) // retries in the background
	}
	return !resp.Succeeded, nil
}

func (e *Engine) deleteGuarded(ctx context.Context, key string, rev int64) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ReleaseTimeout)
	defer cancel()
	_, err := e.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key)).
		Commit()
	return err
}

// scrubKey cleans up after a put of key whose outcome is unknown (the RPC
// failed): the put may have been applied, or may still be applied late, and
// a key of ours that nobody in this process uses would block every other
// process for as long as our session lives. For a while (a late apply comes
// within seconds), it looks at the key now and then and deletes it, guarded
// by its revision, whenever it exists without being this process's current
// key for the lock.
func (e *Engine) scrubKey(sess *concurrency.Session, pfx, key string) {
	e.bg.Go(func(ctx context.Context) {
		for delay := 250 * time.Millisecond; delay <= 8*time.Second; delay *= 2 {
			select {
			case <-time.After(delay):
			case <-sess.Done():
				return // the lease, and the key with it, is gone
			case <-ctx.Done():
				return
			}
			rctx, cancel := context.WithTimeout(ctx, e.cfg.ReleaseTimeout)
			resp, err := e.kv.Get(rctx, key)
			cancel()
			if err != nil || len(resp.Kvs) == 0 {
				continue
			}
			if rev := resp.Kvs[0].CreateRevision; !e.keyInUse(pfx, rev) {
				_ = e.deleteGuarded(ctx, key, rev)
			}
		}
	})
}

// keyInUse reports whether this process's queue for pfx owns the key with
// create revision rev, or is between states (acquiring or releasing) and so
// might: the scrub then waits for its next look.
func (e *Engine) keyInUse(pfx string, rev int64) bool {
	e.mu.Lock()
	q := e.queues[pfx]
	e.mu.Unlock()
	if q == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.busy || (q.own != nil && q.own.rev == rev)
}
