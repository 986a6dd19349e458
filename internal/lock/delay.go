package lock

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/internal/keys"
)

// Lock-delay (Chubby, Consul): after a holder is lost without releasing,
// nobody gets the lock for a while, so that a resource that cannot check a
// fencing token is not used by two holders at once: the lost holder may
// still be at work (paused, cut off) without knowing.
//
// A holder acquired under a lock-delay d (Config.LockDelay) writes a record
// next to its key, with no lease: keys.Delay(lockPrefix) + the key's suffix,
// valued "<key's create revision> <d in ns>". Releasing deletes the record
// in the same transaction as the key, guarded by it. A record whose key is
// gone (or was re-created) therefore marks a holder lost without
// releasing. Every acquirer of the lock, under a lock-delay or not, honours
// such records once it is first in line: it waits d from the moment it
// found the record (at least d after the loss), then deletes the record
// and proceeds. A shared acquirer honours only exclusive holders' records
// (two readers do not conflict).
//
// Whether records exist is read in the same round trip as the acquisition's
// other reads, so locks without records pay no extra round trip; a holder
// under a lock-delay pays one write when it acquires through etcd (not for
// local handoffs). A record of a lost holder stays until the lock's next
// acquirer removes it.

// delaySpec says where an acquisition's lock-delay records live.
type delaySpec struct {
	lockPfx     string // the lock's key prefix: record suffixes are key suffixes under it
	delayPfx    string // "": no lock-delay (stock locks)
	writersOnly bool   // a shared acquirer: honour exclusive holders' records only
	kind        string // metrics label
}

// settleDelay runs once key (created at rev) is first in line, before its
// hold is granted. records says whether the acquisition's last read found
// records. It waits out the lock-delay of every holder lost without
// releasing, removes their records, and writes this holder's record when the
// engine has a lock-delay; it returns that record ("" if none). ctx bounds
// the wait.
func (e *Engine) settleDelay(ctx context.Context, sess *concurrency.Session, ds delaySpec, key string, rev int64, records bool) (string, error) {
	if ds.delayPfx == "" {
		return "", nil
	}
	var ops []clientv3.Op
	if records {
		stale, wait, err := e.staleRecords(ctx, ds, key, rev)
		if err != nil {
			return "", err
		}
		if wait > 0 {
			e.metrics.lockDelayed(ds.kind)
			e.log.Info("lock-delay: a holder was lost without releasing; waiting before taking the lock",
				"key", key, "delay", wait, "records", stale)
			if err := sleepHeld(ctx, sess, wait); err != nil {
				return "", err
			}
		}
		for _, r := range stale {
			ops = append(ops, clientv3.OpDelete(r))
		}
	}
	record := ""
	if e.cfg.LockDelay > 0 {
		record = ds.delayPfx + strings.TrimPrefix(key, ds.lockPfx)
		ops = append(ops, clientv3.OpPut(record, fmt.Sprintf("%d %d", rev, e.cfg.LockDelay.Nanoseconds())))
	}
	if len(ops) == 0 {
		return "", nil
	}
	// Not on the caller's ctx: a record put in flight when a budget ends
	// would stay behind our removed key and delay the next holder.
	wctx, cancel := context.WithTimeout(e.bg.Ctx(), e.cfg.ReleaseTimeout)
	resp, err := e.kv.Txn(wctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).Then(ops...).Commit()
	cancel()
	if err != nil {
		return "", fmt.Errorf("lock-delay records of %s: %w", key, e.sessionErr(sess, err))
	}
	if !resp.Succeeded {
		return "", ErrSessionLost // only its lease's end removes our key
	}
	if cause := context.Cause(ctx); cause != nil {
		return record, cause // the caller removes the key and the record
	}
	return record, nil
}

// staleRecords reads the lock's keys and records at one revision and
// returns the records ds must honour whose keys are gone, with the longest
// of their delays.
func (e *Engine) staleRecords(ctx context.Context, ds delaySpec, key string, rev int64) ([]string, time.Duration, error) {
	resp, err := e.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpGet(ds.lockPfx, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(ds.delayPfx, clientv3.WithPrefix())).
		Commit()
	if err != nil {
		return nil, 0, err
	}
	if !resp.Succeeded {
		return nil, 0, ErrSessionLost
	}
	live := map[string]int64{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		live[string(kv.Key)] = kv.CreateRevision
	}
	var stale []string
	var wait time.Duration
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		suffix := strings.TrimPrefix(string(kv.Key), ds.delayPfx)
		if ds.writersOnly && strings.HasPrefix(suffix, keys.SharedDir) {
			continue
		}
		var holderRev, ns int64
		if _, err := fmt.Sscanf(string(kv.Value), "%d %d", &holderRev, &ns); err != nil {
			e.log.Warn("lock-delay record does not decode; removing it", "key", string(kv.Key), "value", string(kv.Value))
		} else if live[ds.lockPfx+suffix] == holderRev {
			continue // its holder holds or waits
		}
		stale = append(stale, string(kv.Key))
		wait = max(wait, time.Duration(ns))
	}
	return stale, wait, nil
}

// sleepHeld waits d, or until ctx or the session ends.
func sleepHeld(ctx context.Context, sess *concurrency.Session, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-sess.Done():
		return ErrSessionLost
	}
}
