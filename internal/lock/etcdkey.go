package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/keys"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
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
//
// Shared keys of a read-write lock (pfx+"s/"+<lease>-<n>) use the same wait,
// with the youngest older *exclusive* key as the predecessor: readers wait
// for the writers queued before them only, and an exclusive waiter, whose
// predecessors are all older keys, waits for readers and writers alike. A
// reader that queues after a writer therefore waits for it: no writer
// starves. Semaphores have a protocol of their own (etcdsem.go).

// lockKey puts this session's exclusive key under q's prefix and waits until
// it is the oldest. With noWait it returns ErrLocked instead of waiting. On
// error no key is left behind (or, if etcd cannot be reached, its removal is
// retried in the background until the session ends).
//
// reads, if any, are read in the same transaction as the key's put: their
// answers are returned when the key was the oldest at once (no wait), and
// are then as of the revision the lock was taken (nil otherwise).
func (e *Engine) lockKey(ctx context.Context, sess *concurrency.Session, q *Queue, noWait bool, reads []clientv3.Op) (*Ownership, []*etcdserverpb.ResponseOp, error) {
	key := keys.ExclusiveWaiter(q.pfx, int64(sess.Lease()))
	// The put must not be cut short by the caller's ctx (a wait budget
	// expires all the time under load): a put abandoned in flight may still
	// be applied after the cleanup looked for it, leaving a key under our
	// live, renewed lease that every other process would queue behind
	// forever. So the put runs on its own bounded ctx, and the caller's ctx
	// is checked once its outcome is known.
	pctx, cancelPut := context.WithTimeout(e.bg.Ctx(), e.cfg.ReleaseTimeout)
	put, err := e.putWaiterKey(pctx, sess, q.pfx, key, q.delayPfx, reads)
	cancelPut()
	if err != nil {
		return nil, nil, err
	}
	predecessors := older{from: q.pfx, opts: []clientv3.OpOption{clientv3.WithPrefix()}}
	own, err := e.finishAcquire(ctx, sess, key, put, predecessors, noWait, delaySpec{lockPfx: q.pfx, delayPfx: q.delayPfx, kind: q.kind})
	if err != nil || put.blocked {
		return own, nil, err // the answers are from before the wait: not the holder's
	}
	return own, put.answers, nil
}

// putResult is what the put of a waiter key learnt in its round trip.
type putResult struct {
	rev     int64                      // the key's create revision
	blocked bool                       // an older key it must wait for exists
	records bool                       // lock-delay records exist
	answers []*etcdserverpb.ResponseOp // to the extra reads sent with the put
}

// older names the keys a waiter waits for: the keys in from (a prefix or a
// range, by opts) created before it.
type older struct {
	from string
	opts []clientv3.OpOption
}

// youngest is the read of the youngest of them at or below maxRev.
func (o older) youngest(maxRev int64) clientv3.Op {
	opts := append(append([]clientv3.OpOption{}, o.opts...),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1),
		clientv3.WithMaxCreateRev(maxRev))
	return clientv3.OpGet(o.from, opts...)
}

// finishAcquire waits, if put found an older key, until key (created at
// put.rev) has no predecessor left, then settles the lock-delay. On error,
// and when ctx ended meanwhile, it removes key.
func (e *Engine) finishAcquire(ctx context.Context, sess *concurrency.Session, key string, put putResult,
	pred older, noWait bool, ds delaySpec) (*Ownership, error) {
	fail := func(err error) (*Ownership, error) {
		_ = e.removeKey(e.bg.Ctx(), sess, key, put.rev, "")
		return nil, err
	}
	if cause := context.Cause(ctx); cause != nil {
		return fail(cause)
	}
	seen, records := put.rev, put.records
	if put.blocked {
		if noWait {
			return fail(ErrLocked)
		}
		var err error
		if seen, records, err = e.waitPredecessors(ctx, sess, key, put.rev, pred, ds.delayPfx); err != nil {
			return fail(err)
		}
	}
	record, err := e.settleDelay(ctx, sess, ds, key, put.rev, records)
	if err != nil {
		_ = e.removeKey(e.bg.Ctx(), sess, key, put.rev, record)
		return nil, err
	}
	octx, cancel := context.WithCancelCause(context.Background())
	return &Ownership{sess: sess, key: key, rev: put.rev, seenRev: seen, delayRecord: record,
		acquired: time.Now(), ctx: octx, cancel: cancel}, nil
}

// withDelayCount appends to ops the read that says whether lock-delay
// records exist under delayPfx; without a delayPfx (stock locks) nothing:
// a read outside the lock's own keys could be refused to a user whose etcd
// role covers only the prefix.
func withDelayCount(delayPfx string, ops ...clientv3.Op) []clientv3.Op {
	if delayPfx == "" {
		return ops
	}
	return append(ops, clientv3.OpGet(delayPfx, clientv3.WithPrefix(), clientv3.WithCountOnly()))
}

// hasRecords reads the answer of withDelayCount's read, the i-th op.
func hasRecords(rs []*etcdserverpb.ResponseOp, i int) bool {
	return len(rs) > i && rs[i].GetResponseRange().Count > 0
}

// putWaiterKey puts key under the session's lease and learns, in the same
// round trip, whether an older key under pfx exists. A key of ours left
// over from a failed delete is removed first: reusing it would hand its old
// fencing token to a new holder.
//
// reads are sent with the put, after its own reads; their answers are in
// the result.
func (e *Engine) putWaiterKey(ctx context.Context, sess *concurrency.Session, pfx, key, delayPfx string, reads []clientv3.Op) (putResult, error) {
	base := withDelayCount(delayPfx, clientv3.OpPut(key, e.cfg.Identity, clientv3.WithLease(sess.Lease())),
		clientv3.OpGet(pfx, clientv3.WithFirstCreate()...))
	ops := append(base[:len(base):len(base)], reads...)
	for attempt := 0; attempt < 3; attempt++ {
		resp, err := e.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(ops...).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			// The put may or may not have been applied: clean up by reading.
			e.scrubKey(sess, pfx, key)
			return putResult{}, fmt.Errorf("put lock key %s: %w", key, e.sessionErr(sess, err))
		}
		if !resp.Succeeded {
			stale := resp.Responses[0].GetResponseRange().Kvs
			if len(stale) > 0 {
				if err := e.removeKey(ctx, sess, key, stale[0].CreateRevision, ""); err != nil {
					return putResult{}, err
				}
			}
			continue
		}
		owner := resp.Responses[1].GetResponseRange().Kvs
		rev := resp.Header.Revision
		return putResult{rev: rev, blocked: owner[0].CreateRevision != rev, records: hasRecords(resp.Responses, 2),
			answers: resp.Responses[len(base):]}, nil
	}
	return putResult{}, fmt.Errorf("put lock key %s: a stale key of this session keeps reappearing", key)
}

// waitPredecessors waits until no key of pred is older than myRev. It
// returns the revision of its last read (at which key existed) and whether
// that read found lock-delay records under delayPfx.
func (e *Engine) waitPredecessors(ctx context.Context, sess *concurrency.Session, key string, myRev int64,
	pred older, delayPfx string) (seen int64, records bool, err error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(sess.Ctx(), func() { cancel(ErrSessionLost) })
	defer stop()

	for {
		resp, err := e.kv.Txn(wctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", myRev)).
			Then(withDelayCount(delayPfx, pred.youngest(myRev-1))...).
			Commit()
		if err != nil {
			return 0, false, waitErr(wctx, err)
		}
		if !resp.Succeeded {
			// Our key is gone: only its lease's end removes it.
			return 0, false, ErrSessionLost
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return resp.Header.Revision, hasRecords(resp.Responses, 1), nil
		}
		if err := e.waitDelete(wctx, string(kvs[0].Key), kvs[0].CreateRevision, resp.Header.Revision); err != nil {
			return 0, false, waitErr(wctx, err)
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
	return e.waitWatch(ctx, key, []clientv3.OpOption{clientv3.WithFilterPut()}, readRev, func(ctx context.Context) (bool, error) {
		resp, err := e.kv.Get(ctx, key, clientv3.WithKeysOnly())
		if err != nil {
			return false, err
		}
		return len(resp.Kvs) > 0 && resp.Kvs[0].CreateRevision == createRev, nil
	}, func(ev *clientv3.Event) bool { return ev.Type == mvccpb.DELETE })
}

// waitWatch watches key (with opts) from the current revision and returns
// at the first event for which wake is true, or when the watch ends in a way
// that calls for re-reading. If anything was written between the caller's
// read (readRev) and the watch's start, blocked tells whether the caller is
// still blocked; if not, it returns at once.
func (e *Engine) waitWatch(ctx context.Context, key string, opts []clientv3.OpOption, readRev int64,
	blocked func(context.Context) (bool, error), wake func(*clientv3.Event) bool) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	created := false
	for wr := range e.client.Watch(wctx, key, append(opts, clientv3.WithCreatedNotify())...) {
		if wr.CompactRevision != 0 {
			return nil // the caller re-reads
		}
		if err := wr.Err(); err != nil {
			return err
		}
		if wr.Created && !created {
			created = true
			if wr.Header.Revision > readRev {
				// Something was written since the read: what we wait for
				// may be among it, before the watch's start.
				still, err := blocked(wctx)
				if err != nil {
					return err
				}
				if !still {
					return nil
				}
			}
		}
		for _, ev := range wr.Events {
			if wake(ev) {
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

// withSession runs acquire under the live session (starting one if need
// be), and once more under a new one if etcd answered that the first one's
// lease is gone: its put wrote nothing, and the lease may have been found
// gone just now (its keys' deletion ended this process's holds before its
// keepalive noticed). ctx bounds the session's start.
func (e *Engine) withSession(ctx context.Context, acquire func(*concurrency.Session) (*Ownership, error)) (*concurrency.Session, *Ownership, error) {
	for attempt := 0; ; attempt++ {
		sess, err := e.Session(ctx)
		if err != nil {
			return nil, nil, err
		}
		own, err := acquire(sess)
		if err != nil && attempt == 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) && ctx.Err() == nil {
			continue
		}
		return sess, own, err
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
// ended meanwhile (the likely reason for the failure). etcd's "lease not
// found" proves the lease is gone: the session is retired at once (the
// next Session call starts a new one) and ended (Orphan stops its
// keepalive, which closes Done and runs the loss handling), not when its
// keepalive notices, so that the next call does not fail the same way.
func (e *Engine) sessionErr(sess *concurrency.Session, err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		e.retireSession(sess)
		return fmt.Errorf("%w: %w", ErrSessionLost, err)
	}
	if isDone(sess.Done()) {
		return fmt.Errorf("%w: %w", ErrSessionLost, err)
	}
	return err
}
