package lock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/keys"
)

// The etcd side of a semaphore of limit L. Every holder and waiter puts a
// key pfx+<lease>-<n> under its session's lease, valued L; keys are served
// in create-revision order, and a key holds a permit once fewer than L keys
// are older than it. Holding is monotonic: keys only ever disappear from in
// front of a key, so a key that holds keeps holding until it is deleted.
//
// No thundering herd: a key at position p (0-based, by create revision)
// waits for one thing only.
//   - p == L, the head of the line: for any older key's deletion (any of
//     the L holders' release lets it in). It watches the prefix for
//     deletes; only the head does.
//   - p > L: for its predecessor (the key at p-1) to change: be deleted
//     (a waiter gave up) or be re-put (it became a holder, see below).
//     Then it re-reads its position: it may be the head now.
//
// A key that held only after waiting re-puts itself (same value, same
// lease; a "mark") so that the key behind it, which watches it, learns that
// the head moved and starts watching the holders. So a release wakes the
// head, and the head's mark wakes the next: two wake-ups per permit handed
// on, whatever the number of waiters.
//
// The limit is stored in every key: the put is a transaction whose compare
// says that every key under the prefix has the value L (or that there is
// none), so two processes can never hold one semaphore with different
// limits. A put refused for a different limit writes nothing (*LimitError).

// lockSem puts a key for q with limit and waits until it holds a permit.
func (e *Engine) lockSem(ctx context.Context, sess *concurrency.Session, q *semQueue, limit int, noWait bool) (*Ownership, error) {
	key := keys.SeqWaiter(q.pfx, int64(sess.Lease()), e.seq.Add(1))
	lim := strconv.Itoa(limit)
	byCreate := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	put := withDelayCount(q.delayPfx,
		clientv3.OpPut(key, lim, clientv3.WithLease(sess.Lease())),
		clientv3.OpGet(q.pfx, byCreate...))
	// On its own bounded ctx, as lockKey's put.
	pctx, cancelPut := context.WithTimeout(e.bg.Ctx(), e.cfg.ReleaseTimeout)
	resp, err := e.kv.Txn(pctx).
		If(clientv3.Compare(clientv3.Value(q.pfx), "=", lim).WithPrefix()).
		Then(put...).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Version(q.pfx), "=", 0).WithPrefix()},
			put,
			[]clientv3.Op{clientv3.OpGet(q.pfx, clientv3.WithPrefix())})).
		Commit()
	cancelPut()
	if err != nil {
		e.scrubKey(sess, q.pfx, key)
		return nil, fmt.Errorf("put semaphore key %s: %w", key, e.sessionErr(sess, err))
	}
	rs := resp.Responses
	if !resp.Succeeded {
		inner := rs[0].GetResponseTxn()
		if !inner.Succeeded {
			return nil, limitError(limit, inner.Responses[0].GetResponseRange().Kvs)
		}
		rs = inner.Responses
	}
	myRev := resp.Header.Revision
	fail := func(err error) (*Ownership, error) {
		_ = e.removeKey(e.bg.Ctx(), sess, key, myRev, "")
		return nil, err
	}
	if cause := context.Cause(ctx); cause != nil {
		return fail(cause)
	}
	kvs, records := rs[1].GetResponseRange().Kvs, hasRecords(rs, 2)
	seen := myRev
	if position(kvs, myRev) >= limit {
		if noWait {
			return fail(ErrLocked)
		}
		if seen, records, err = e.waitPermit(ctx, sess, q, key, myRev, limit, kvs, byCreate); err != nil {
			return fail(err)
		}
		e.markHolder(sess, key, myRev, lim)
	}
	record, err := e.settleDelay(ctx, sess, delaySpec{lockPfx: q.pfx, delayPfx: q.delayPfx, kind: q.kind}, key, myRev, records)
	if err != nil {
		_ = e.removeKey(e.bg.Ctx(), sess, key, myRev, record)
		return nil, err
	}
	octx, cancel := context.WithCancelCause(context.Background())
	return &Ownership{sess: sess, key: key, rev: myRev, seenRev: seen, delayRecord: record,
		acquired: time.Now(), ctx: octx, cancel: cancel}, nil
}

// limitError reports the limit the semaphore's keys (kvs) carry.
func limitError(want int, kvs []*mvccpb.KeyValue) error {
	for _, kv := range kvs {
		if v := string(kv.Value); v != strconv.Itoa(want) {
			have, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%w: key %s holds limit %q, which is not a number", ErrLimitMismatch, kv.Key, v)
			}
			return &LimitError{Want: want, Have: have}
		}
	}
	// The keys changed between the two compares: report it as a mismatch
	// all the same, the caller may retry.
	return &LimitError{Want: want}
}

// position is the number of keys in kvs (sorted by create revision) older
// than rev.
func position(kvs []*mvccpb.KeyValue, rev int64) int {
	n := 0
	for _, kv := range kvs {
		if kv.CreateRevision < rev {
			n++
		}
	}
	return n
}

// waitPermit waits until fewer than limit keys are older than key. kvs is
// the semaphore's keys at revision myRev (the put). It returns the revision
// of its last read and whether it found lock-delay records.
func (e *Engine) waitPermit(ctx context.Context, sess *concurrency.Session, q *semQueue, key string, myRev int64,
	limit int, kvs []*mvccpb.KeyValue, byCreate []clientv3.OpOption) (int64, bool, error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(sess.Ctx(), func() { cancel(ErrSessionLost) })
	defer stop()

	readRev := myRev
	for {
		p := position(kvs, myRev)
		var err error
		if p == limit {
			// The head: any older key's deletion lets it in. Still blocked
			// if as many keys are older as at the read (older keys never
			// appear, they only go).
			err = e.waitWatch(wctx, q.pfx, []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterPut()}, readRev,
				func(ctx context.Context) (bool, error) {
					resp, err := e.kv.Get(ctx, q.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(myRev-1))
					return err == nil && len(resp.Kvs) == p, err
				},
				func(ev *clientv3.Event) bool { return ev.Type == mvccpb.DELETE })
		} else {
			// Behind the head: its predecessor's change (deleted, or marked
			// as holding) moves it up.
			pred := kvs[p-1]
			err = e.waitWatch(wctx, string(pred.Key), nil, readRev,
				func(ctx context.Context) (bool, error) {
					resp, err := e.kv.Get(ctx, string(pred.Key), clientv3.WithKeysOnly())
					return err == nil && len(resp.Kvs) > 0 && resp.Kvs[0].ModRevision == pred.ModRevision, err
				},
				func(*clientv3.Event) bool { return true })
		}
		if err != nil {
			return 0, false, waitErr(wctx, err)
		}
		resp, err := e.kv.Txn(wctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", myRev)).
			Then(withDelayCount(q.delayPfx, clientv3.OpGet(q.pfx, byCreate...))...).
			Commit()
		if err != nil {
			return 0, false, waitErr(wctx, err)
		}
		if !resp.Succeeded {
			return 0, false, ErrSessionLost // only its lease's end removes our key
		}
		kvs, readRev = resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision
		if position(kvs, myRev) < limit {
			return readRev, hasRecords(resp.Responses, 1), nil
		}
	}
}

// markHolder re-puts a key that holds after waiting (see above), in the
// background: the holder need not wait for it.
func (e *Engine) markHolder(sess *concurrency.Session, key string, rev int64, lim string) {
	e.bg.Go(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, e.cfg.ReleaseTimeout)
		defer cancel()
		_, err := e.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, lim, clientv3.WithIgnoreLease())).
			Commit()
		if err != nil && !isDone(sess.Done()) {
			// The waiter behind it wakes at the next release instead.
			e.log.Debug("semaphore holder mark failed", "key", key, "err", err)
		}
	})
}
