package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/keys"
)

// The key watch: one watch per process over each of the named locks'
// prefixes (Config.WatchPrefixes), for as long as its session lives, rather
// than one watch per hold. It tells
//   - a queue holding a key that the key was deleted: the holds under the
//     key end with ErrLost, and Done fires, instead of only when the session
//     ends (never, if someone ran `etcdctl del` on a live session's key).
//     One read of the key's lease tells the two causes apart: if the lease
//     is gone too (it expired or was revoked before this process's keepalive
//     noticed), the whole session is ended at once, as its keepalive would
//     have: every hold under it is lost, its waiters fail with
//     ErrSessionLost, and the next acquisition starts a new session. If the
//     lease lives (the key alone was deleted), only that key's holds are
//     lost, and the queue's waiters take their turn in etcd anew;
//   - a read-write lock's shared queue that an exclusive key was created
//     (a writer queued): its keys older than the writer close to joiners.
//
// It starts with the session's first named key, from the revision at which
// that key was last seen (an unsynced watch catches up from there). A key
// acquired later whose last sighting predates the watch's start is checked
// once with a read. On compaction (history lost) every held key is checked
// with a read and the watch goes on from the compaction.

// keyWatch is the state of the engine's key watch. Guarded by Engine.mu.
type keyWatch struct {
	sess  *concurrency.Session // the session it runs for; nil: none
	start int64                // its first revision
	// deleted is the revision of the latest deletion seen of each key, for
	// a key acquired just as it was deleted: its queue did not own it yet
	// when the event came, so watchOwned looks here once it does. Emptied
	// when it grows past maxDeleted.
	deleted map[string]int64
}

// maxDeleted bounds keyWatch.deleted: keys are per session, so a map of
// this size covers seconds of deletions at any rate seen here.
const maxDeleted = 4096

// watchOwned makes sure the key watch covers own's key, which its queue
// owns now.
func (e *Engine) watchOwned(own *Ownership) {
	started, from := e.watchSession(own.sess, own.seenRev+1)
	e.mu.Lock()
	deleted := e.kw.deleted[own.key]
	e.mu.Unlock()
	switch {
	case deleted > own.rev: // deleted before its queue owned it
		if q := e.lookup(queuePrefix(own.key)); q != nil {
			e.bg.Go(func(ctx context.Context) { e.keyDeleted(ctx, q, own, deleted) })
		}
	case !started && from > own.seenRev+1: // the watch started after the key's last sighting
		e.bg.Go(func(ctx context.Context) { e.checkOwned(ctx, own) })
	}
}

// watchSession starts the key watch of sess from revision from, unless it
// runs already; then it returns the revision it started from.
func (e *Engine) watchSession(sess *concurrency.Session, from int64) (started bool, start int64) {
	if len(e.cfg.WatchPrefixes) == 0 {
		return false, 0
	}
	e.mu.Lock()
	if e.closed.Load() || isDone(sess.Done()) {
		e.mu.Unlock()
		return false, 0
	}
	if e.kw.sess == sess {
		start = e.kw.start
		e.mu.Unlock()
		return false, start
	}
	e.kw = keyWatch{sess: sess, start: from, deleted: map[string]int64{}}
	e.mu.Unlock()
	for _, pfx := range e.cfg.WatchPrefixes {
		e.bg.Go(func(ctx context.Context) { e.runKeyWatch(ctx, sess, pfx, from) })
	}
	return true, from
}

// runKeyWatch watches the keys under pfx from revision rev until the
// session or the engine ends.
func (e *Engine) runKeyWatch(ctx context.Context, sess *concurrency.Session, pfx string, rev int64) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(sess.Ctx(), cancel)
	defer stop()
	for wctx.Err() == nil {
		for wr := range e.client.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(rev)) {
			if wr.CompactRevision != 0 {
				e.checkAllOwned(wctx)
				rev = wr.CompactRevision
				break
			}
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				e.keyEvent(ev)
				// A rewatch starts after the last event seen; events seen
				// twice are harmless (keyGone and writerQueued are
				// idempotent).
				rev = max(rev, ev.Kv.ModRevision+1)
			}
		}
		select {
		case <-wctx.Done():
		case <-time.After(100 * time.Millisecond): // a broken watch: do not spin
		}
	}
}

// keyEvent hands one event to the queue it concerns.
func (e *Engine) keyEvent(ev *clientv3.Event) {
	if e.closed.Load() {
		return // Close's revocation deletes every key: not a loss
	}
	key := string(ev.Kv.Key)
	pfx := queuePrefix(key)
	switch {
	case ev.Type == clientv3.EventTypeDelete:
		// Recorded before the queue is asked: a key installed after this
		// finds the record (watchOwned), one installed before is owned.
		e.mu.Lock()
		if e.kw.deleted == nil || len(e.kw.deleted) >= maxDeleted {
			e.kw.deleted = map[string]int64{}
		}
		e.kw.deleted[key] = ev.Kv.ModRevision
		e.mu.Unlock()
		if q := e.lookup(pfx); q != nil {
			for _, own := range q.owned() {
				if own.key == key && own.rev < ev.Kv.ModRevision {
					e.bg.Go(func(ctx context.Context) { e.keyDeleted(ctx, q, own, ev.Kv.ModRevision) })
				}
			}
		}
	case ev.IsCreate():
		// An exclusive key's queue prefix is the lock's; its shared
		// queue, if any, lives in the shared subdirectory.
		if q, ok := e.lookup(pfx + keys.SharedDir).(*sharedQueue); ok {
			q.writerQueued(ev.Kv.CreateRevision)
		}
	}
}

// keyDeleted ends what the deletion of own's key (queue q, at revision
// rev) ends: the whole session if its lease is gone too, else the key's
// holds (see above).
func (e *Engine) keyDeleted(ctx context.Context, q lockQueue, own *Ownership, rev int64) {
	var ttl *clientv3.LeaseTimeToLiveResponse
	err := etcdcall.Run(ctx, func(ctx context.Context) (err error) {
		ctx, cancel := context.WithTimeout(ctx, e.cfg.ReleaseTimeout)
		defer cancel()
		ttl, err = e.client.TimeToLive(ctx, own.sess.Lease())
		return err
	})
	if e.keyGoneAtClose() {
		// Close began meanwhile (keyEvent checks before this goroutine
		// starts): the lease is gone because Close revoked it.
		return
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && ttl.TTL < 0) {
		e.log.Warn("etcd session lost: a lock key of its lease was deleted and the lease is gone",
			"key", own.key, "lease", fmt.Sprintf("%x", int64(own.sess.Lease())))
		e.retireSession(own.sess)
		return
	}
	q.keyGone(own.key, rev)
}

// checkOwned ends own if its key is gone (for a key the watch may have
// missed the deletion of).
func (e *Engine) checkOwned(ctx context.Context, own *Ownership) {
	rctx, cancel := context.WithTimeout(ctx, e.cfg.ReleaseTimeout)
	defer cancel()
	resp, err := e.kv.Get(rctx, own.key, clientv3.WithKeysOnly())
	if err != nil || (len(resp.Kvs) > 0 && resp.Kvs[0].CreateRevision == own.rev) {
		return // gone or not, the session's end still tells
	}
	if q := e.lookup(queuePrefix(own.key)); q != nil {
		e.keyDeleted(ctx, q, own, resp.Header.Revision)
	}
}

// checkAllOwned checks every key the engine's queues hold.
func (e *Engine) checkAllOwned(ctx context.Context) {
	e.mu.Lock()
	qs := make([]lockQueue, 0, len(e.queues))
	for _, q := range e.queues {
		qs = append(qs, q)
	}
	e.mu.Unlock()
	for _, q := range qs {
		for _, own := range q.owned() {
			e.checkOwned(ctx, own)
		}
	}
}
