package lock

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Deletes of lock keys: every one is a Txn guarded by the key's create
// revision (etcd issue 22082), and a failed one is retried in the
// background until it succeeds or the session ends (which removes the key
// anyway). A key's lock-delay record, if it wrote one, goes in the same Txn.

// removeKey deletes key (and record, if not "") if its create revision is
// still rev; ctx bounds the first attempt. If it fails, the delete is
// retried in the background and the first error is returned.
func (e *Engine) removeKey(ctx context.Context, sess *concurrency.Session, key string, rev int64, record string) error {
	return e.removeFailed(sess, key, rev, record, e.deleteGuarded(ctx, key, rev, record))
}

// removeFailed handles the outcome err of a first attempt to delete key:
// after a failure it retries in the background and returns the error.
func (e *Engine) removeFailed(sess *concurrency.Session, key string, rev int64, record string, err error) error {
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
			if e.deleteGuarded(ctx, key, rev, record) == nil {
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
// had been lost, another process may have held the lock meanwhile, and the
// key's lock-delay record is left for the next holder to honour.
func (e *Engine) releaseKey(ctx context.Context, own *Ownership) (gone bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, e.cfg.ReleaseTimeout)
	resp, err := e.kv.Txn(dctx).
		If(clientv3.Compare(clientv3.CreateRevision(own.key), "=", own.rev)).
		Then(deleteOps(own.key, own.delayRecord)...).
		Commit()
	cancel()
	if err != nil {
		if isDone(own.sess.Done()) {
			// The session ended while the delete was under way, and the
			// key with its lease: the hold was lost, and nothing tells
			// whether before this unlock. removeFailed would call that
			// nothing to retry (nil), and Unlock reported a lost lock as
			// released (TestPausedHolderOnSecondCluster, once, in CI).
			return true, nil
		}
		return false, e.removeFailed(own.sess, own.key, own.rev, own.delayRecord, err) // retries in the background
	}
	return !resp.Succeeded, nil
}

func (e *Engine) deleteGuarded(ctx context.Context, key string, rev int64, record string) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ReleaseTimeout)
	defer cancel()
	_, err := e.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(deleteOps(key, record)...).
		Commit()
	return err
}

func deleteOps(key, record string) []clientv3.Op {
	if record == "" {
		return []clientv3.Op{clientv3.OpDelete(key)}
	}
	return []clientv3.Op{clientv3.OpDelete(key), clientv3.OpDelete(record)}
}

// scrubKey cleans up after a put of key whose outcome is unknown (the RPC
// failed): the put may have been applied, or may still be applied late, and
// a key of ours that nobody in this process uses would block every other
// process for as long as our session lives. For a while (a late apply comes
// within seconds), it looks at the key now and then and deletes it, guarded
// by its revision, whenever it exists without being in use by this
// process's queue under pfx.
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
			if rev := resp.Kvs[0].CreateRevision; !e.keyInUse(pfx, key, rev) {
				_ = e.deleteGuarded(ctx, key, rev, "")
			}
		}
	})
}

// keyInUse reports whether this process's queue for pfx owns key at create
// revision rev, or is between states (acquiring or releasing) and so might.
func (e *Engine) keyInUse(pfx, key string, rev int64) bool {
	q := e.lookup(pfx)
	return q != nil && q.keyInUse(key, rev)
}

// queuePrefix is the prefix of the queue a lock key belongs to: the key up
// to its last '/' (lock names and leases contain none).
func queuePrefix(key string) string {
	return key[:strings.LastIndexByte(key, '/')+1]
}
