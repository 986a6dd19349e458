package segments

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Absorbing an inbox. A segment's inbox is where refills and releases land
// (anyone adds to it, under a compare of its revision); the holder of the
// segment's lock moves it into the counter when its orders need more than
// the counter holds. That move compares the inbox's revision, so a deposit
// landing meanwhile fails it: it is a transaction of its own, never part of
// a group commit, so that the deposit fails nothing but the absorb, which is
// simply read again and retried.

// needAbsorb lists the held places of a plan whose orders need their
// inbox. A direct place absorbs its inbox in the batch's own transaction
// (txn): its fence compares the inbox there.
func needAbsorb(order []*placePlan) []*placePlan {
	var out []*placePlan
	for _, pp := range order {
		if pp.absorb && pp.fence == lockFence {
			out = append(out, pp)
		}
	}
	return out
}

// absorb moves the inboxes of places into their counters in one
// transaction fenced by each place's lock, comparing each counter's and
// inbox's revision as cached. On success the caches say so; on a failed
// compare they are refreshed from the Else reads; on an error they are
// read again before their next use. The caller plans again either way.
func (e *Engine) absorb(ctx context.Context, places []*placePlan) {
	var cmps []clientv3.Cmp
	var ops, diag []clientv3.Op
	sums := make([]int64, len(places)) // each counter after the absorb
	for i, bp := range places {
		st := bp.st
		st.mu.Lock()
		value, mod, in, inMod := st.value, st.modRev, st.inbox, st.inMod
		st.mu.Unlock()
		sums[i] = value + in
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(bp.own.Key()), "=", bp.own.Rev()),
			clientv3.Compare(clientv3.ModRevision(st.key), "=", mod),
			clientv3.Compare(clientv3.ModRevision(st.inKey), "=", inMod))
		ops = append(ops, clientv3.OpPut(st.key, EncodeCounter(sums[i])), clientv3.OpPut(st.inKey, EncodeCounter(0)))
		diag = append(diag, clientv3.OpGet(st.key), clientv3.OpGet(st.inKey))
	}
	resp, err := e.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
	switch {
	case err != nil:
		for _, bp := range places {
			bp.st.invalidate()
		}
	case resp.Succeeded:
		for i, bp := range places {
			bp.st.absorbed(bp.own, sums[i], resp.Header.Revision)
		}
	default:
		e.refreshFrom(places, resp.Responses)
	}
}

// refreshPlaces reads the counters and inboxes of places (one transaction
// per max-txn-ops) into their caches: after a refused group commit, when
// they may have moved.
func (e *Engine) refreshPlaces(ctx context.Context, places []*placePlan) {
	per := max(1, e.cfg.MaxTxnOps/2)
	for len(places) > 0 {
		chunk := places[:min(per, len(places))]
		places = places[len(chunk):]
		ops := make([]clientv3.Op, 0, 2*len(chunk))
		for _, bp := range chunk {
			ops = append(ops, clientv3.OpGet(bp.st.key))
			if bp.st.inKey != "" {
				ops = append(ops, clientv3.OpGet(bp.st.inKey))
			}
		}
		resp, err := e.kv.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			for _, bp := range chunk {
				bp.st.invalidate()
			}
			continue
		}
		e.refreshFrom(chunk, resp.Responses)
	}
}

// refreshFrom records, for each place, its counter and (a segment's) inbox
// as read by Gets in rs, in the order of places.
func (e *Engine) refreshFrom(places []*placePlan, rs []*pb.ResponseOp) {
	i := 0
	for _, bp := range places {
		st := bp.st
		value, mod, err := decodeHeldCounterKV(st.key, rs[i].GetResponseRange())
		i++
		var in, inMod int64
		var inErr error
		if st.inKey != "" {
			in, inMod, inErr = decodeCounterKV(st.inKey, rs[i].GetResponseRange())
			i++
		}
		st.mu.Lock()
		if st.token == bp.own.Rev() {
			if err != nil || inErr != nil {
				st.stale = true
			} else {
				st.value, st.modRev = value, mod
				if st.inKey != "" {
					st.seeInboxLocked(in, inMod)
				}
			}
		}
		st.mu.Unlock()
	}
}
