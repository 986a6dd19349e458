package segments

import (
	"context"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Per-user limits. On a SKU with a limit, each buyer has a counter key
// (keys.User) holding the units its active orders hold: every commit that
// takes stock for the buyer adds to it, every release, cancel and expiry
// takes off it, each in the same transaction as the stock it moves. The
// committer compares the counter's ModRevision and puts its new value in the
// group commit, so the limit check is atomic with the deduction: two
// processes selling to one buyer at once cannot both pass it, the second
// one's compare fails, it re-reads and judges again.
//
// Cost: distinct buyers are distinct keys, so the sale is not serialised on
// one key; a group commit gains one compare, one put and one Else read per
// distinct buyer in it. A compare that fails (another process sold to the
// same buyer since this one last read) costs the whole group one more round
// trip, as any failed compare of a group commit does.

// maxUserCache bounds the committer's cache of buyers' counters; it is
// cleared when full (a counter not cached is read before its next commit).
const maxUserCache = 1 << 16

// userCache is the committer's view of buyers' counters, as last read or
// committed by this process.
type userCache struct {
	mu sync.Mutex
	m  map[string]userCount
}

type userCount struct {
	value, modRev int64
}

func (u *userCache) get(key string) (userCount, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	v, ok := u.m[key]
	return v, ok
}

func (u *userCache) set(key string, v userCount) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil || len(u.m) >= maxUserCache {
		u.m = make(map[string]userCount)
	}
	u.m[key] = v
}

func (u *userCache) forget(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.m, key)
}

// batchUser is one buyer's counter in a group commit.
type batchUser struct {
	key           string
	sku, buyer    string
	limit         int64
	value, modRev int64 // as read
	add           int64 // what the batch's orders add
}

// seeUser records a counter read from etcd (kvs empty: the key is absent,
// which reads as 0 at ModRevision 0).
func (u *userCache) see(key string, kvs []*mvccpb.KeyValue) error {
	if len(kvs) == 0 {
		u.set(key, userCount{})
		return nil
	}
	v, err := DecodeCounter(key, kvs[0].Value)
	if err != nil {
		u.forget(key)
		return err
	}
	u.set(key, userCount{value: v, modRev: kvs[0].ModRevision})
	return nil
}

// planUsers works out the buyers' counters of a batch, and answers the
// orders that would take their buyer past the limit: with
// ErrLimitExceeded, judged on a counter read fresh from etcd (a cached one
// may be too high: a release elsewhere took units off it), or with the
// first result when the order ID turns out to be applied already (a retry
// must learn its outcome, not a refusal). It returns the buyers to write
// and the requests to commit.
func (e *Engine) planUsers(ctx context.Context, batch []*commitReq) ([]*batchUser, []*commitReq) {
	cache := &e.users
	var unknown []string
	seen := map[string]bool{}
	for _, cr := range batch {
		if k := cr.req.userKey; k != "" && !seen[k] {
			seen[k] = true
			if _, ok := cache.get(k); !ok {
				unknown = append(unknown, k)
			}
		}
	}
	if len(seen) == 0 {
		return nil, batch
	}
	fresh := map[string]bool{}
	var claims map[string]*mvccpb.KeyValue
	var freshRev int64
	if len(unknown) > 0 {
		if _, _, err := e.readUsers(ctx, unknown, nil); err != nil {
			// Those orders cannot be judged: answer them, plan the rest.
			batch = failTouching(batch, unknown, err)
		}
	}
	for attempt := 0; ; attempt++ {
		byKey := map[string]*batchUser{}
		var users []*batchUser
		var keep, over []*commitReq
		for _, cr := range batch {
			k := cr.req.userKey
			if k == "" {
				keep = append(keep, cr)
				continue
			}
			bu := byKey[k]
			if bu == nil {
				cur, _ := cache.get(k)
				bu = &batchUser{key: k, sku: cr.req.sku.name, buyer: cr.req.buyer, limit: cr.req.sku.perUserLimit,
					value: cur.value, modRev: cur.modRev}
				byKey[k] = bu
				users = append(users, bu)
			}
			if bu.value+bu.add+cr.req.qty > bu.limit {
				over = append(over, cr)
				continue
			}
			bu.add += cr.req.qty
			keep = append(keep, cr)
		}
		if len(over) == 0 {
			return dropIdle(users), keep
		}
		if attempt == 0 {
			// Judge again on fresh counters, and learn which of the
			// refused orders were applied already.
			var stale []string
			var ids []*allocReq
			for _, cr := range over {
				if !fresh[cr.req.userKey] {
					fresh[cr.req.userKey] = true
					stale = append(stale, cr.req.userKey)
				}
			}
			for _, cr := range batch {
				if fresh[cr.req.userKey] {
					ids = append(ids, cr.req)
				}
			}
			var err error
			if claims, freshRev, err = e.readUsers(ctx, stale, ids); err != nil {
				// Answer the orders of the buyers that could not be
				// read again; the others were within their limits.
				batch = failTouching(batch, stale, err)
			}
			continue
		}
		for _, cr := range over {
			if idx := claims[cr.req.order]; idx != nil {
				cr.finish(result(e.replay(ctx, cr.req, idx)))
				continue
			}
			bu := byKey[cr.req.userKey]
			cr.finish(failed(&LimitExceededError{SKU: bu.sku, Buyer: bu.buyer, Limit: bu.limit,
				Held: bu.value + bu.add, Want: cr.req.qty, Revision: freshRev}))
		}
		return dropIdle(users), keep
	}
}

// dropIdle leaves out the buyers none of whose orders is committed.
func dropIdle(users []*batchUser) []*batchUser {
	out := users[:0]
	for _, bu := range users {
		if bu.add > 0 {
			out = append(out, bu)
		}
	}
	return out
}

// failTouching answers the requests of buyers in keys with err, and returns
// the others.
func failTouching(batch []*commitReq, keys []string, err error) []*commitReq {
	bad := map[string]bool{}
	for _, k := range keys {
		bad[k] = true
	}
	var keep []*commitReq
	for _, cr := range batch {
		if bad[cr.req.userKey] {
			cr.finish(failed(err))
		} else {
			keep = append(keep, cr)
		}
	}
	return keep
}

// readUsers reads buyers' counters into the cache and the records of
// orders (their IDs' claims), in one transaction, and returns the records
// found, by order ID, and its revision.
func (e *Engine) readUsers(ctx context.Context, userKeys []string, orders []*allocReq) (map[string]*mvccpb.KeyValue, int64, error) {
	ops := make([]clientv3.Op, 0, len(userKeys)+len(orders))
	for _, k := range userKeys {
		ops = append(ops, clientv3.OpGet(k))
	}
	for _, req := range orders {
		ops = append(ops, clientv3.OpGet(e.orderKey(req)))
	}
	resp, err := e.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, err
	}
	cache := &e.users
	for i, k := range userKeys {
		if err := cache.see(k, resp.Responses[i].GetResponseRange().GetKvs()); err != nil {
			return nil, 0, err
		}
	}
	claims := map[string]*mvccpb.KeyValue{}
	for i, req := range orders {
		if kvs := resp.Responses[len(userKeys)+i].GetResponseRange().GetKvs(); len(kvs) > 0 {
			claims[req.order] = kvs[0]
		}
	}
	return claims, resp.Header.Revision, nil
}

// appendUserCmpsOps adds a batch's buyers' compares and puts.
func appendUserCmpsOps(cmps []clientv3.Cmp, ops []clientv3.Op, users []*batchUser) ([]clientv3.Cmp, []clientv3.Op) {
	for _, bu := range users {
		cmps = append(cmps, revisionIs(clientv3.ModRevision(bu.key), bu.modRev))
		ops = append(ops, clientv3.OpPut(bu.key, EncodeCounter(bu.value+bu.add)))
	}
	return cmps, ops
}

// settleUsers updates the cache after a batch: committed at rev, or (rs
// set) refreshed from the failed batch's Else reads, or (neither) unknown.
func (e *Engine) settleUsers(users []*batchUser, rev int64, rs []*pb.ResponseOp) {
	cache := &e.users
	for i, bu := range users {
		switch {
		case rev > 0:
			cache.set(bu.key, userCount{value: bu.value + bu.add, modRev: rev})
		case rs != nil:
			_ = cache.see(bu.key, rs[i].GetResponseRange().GetKvs())
		default:
			cache.forget(bu.key)
		}
	}
}

// changedUsers are the buyers of a failed batch whose counter is not at the
// revision the batch compared (rs: the batch's Else reads of them).
func changedUsers(users []*batchUser, rs []*pb.ResponseOp) map[string]bool {
	var out map[string]bool
	for i, bu := range users {
		var mod int64
		if kvs := rs[i].GetResponseRange().GetKvs(); len(kvs) > 0 {
			mod = kvs[0].ModRevision
		}
		if mod != bu.modRev {
			if out == nil {
				out = map[string]bool{}
			}
			out[bu.key] = true
		}
	}
	return out
}
