package segments

import (
	"context"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The direct committer (see direct.go for why). It works as the committer
// does (commit.go): every direct order waiting at that moment, of every
// SKU, goes in one transaction, up to two transactions in flight when
// their places, buyers and order IDs are disjoint. Per place the
// transaction compares that the segment's lock has no key (no holder, no
// waiter), that the counter is at the ModRevision the place's direct cache
// knows and, when the orders need the inbox too, the inbox's; it writes the
// counter (and empties the inbox). Per order and per buyer it is the
// committer's own compares and puts.
//
// A refused transaction's Else branch reads every place's counter, inbox
// and lock keys, and every order's ID. Orders whose ID was used get the
// first result (a replay); orders on a place that was taken, or that no
// longer holds their units, are answered resShort (they climb the ladder:
// nothing was deducted); the rest are sent again, on the caches refreshed
// from what the Else branch read, while their callers' ctx lasts, up to
// maxCommitAttempts.

// directPlaceCost is what a direct place costs a transaction: three
// compares (the lock's range, the counter, the inbox), two puts, three
// reads in the Else branch (the counter, the inbox, the lock's keys).
var directPlaceCost = opCost{cmps: 3, puts: 2, gets: 3}

// selectDirects is the direct batcher's Select.
func (e *Engine) selectDirects(queue []*commitReq) (batch, rest []*commitReq) {
	return e.directInflight.take(queue, e.cfg.MaxTxnOps, directPlaceCost)
}

// commitDirects commits a batch of direct orders, or answers each of them
// (the direct batcher's Commit).
func (e *Engine) commitDirects(bg context.Context, batch []*commitReq) {
	defer e.directInflight.unmark(slices.Clone(batch))
	ctx, cancel := context.WithTimeout(bg, e.cfg.CommitTimeout)
	defer cancel()
	for len(batch) > 0 {
		batch = e.commitDirectOnce(ctx, batch)
	}
}

// directPlan is one place of a direct batch.
type directPlan struct {
	st      *placeState
	lockPfx string
	take    int64
	n       int
	value   int64 // the counter after the batch
	mod     int64 // the counter's expected ModRevision
	absorb  bool
	inMod   int64
	short   bool // the cache does not show the batch's units there
}

// planDirect works out each place's new counter from its direct cache.
func planDirect(batch []*commitReq) (map[*placeState]*directPlan, []*directPlan) {
	places := map[*placeState]*directPlan{}
	var order []*directPlan
	for _, cr := range batch {
		for _, p := range cr.parts {
			dp := places[p.st]
			if dp == nil {
				dp = &directPlan{st: p.st, lockPfx: p.lockPfx}
				places[p.st] = dp
				order = append(order, dp)
			}
			dp.take += p.qty
			dp.n++
		}
	}
	for _, dp := range order {
		st := dp.st
		st.mu.Lock()
		d := st.direct
		st.mu.Unlock()
		dp.mod = d.mod
		switch {
		case !d.known:
			dp.short = true
		case d.value >= dp.take:
			dp.value = d.value - dp.take
		case d.value+d.inbox >= dp.take:
			dp.absorb, dp.inMod = true, d.inMod
			dp.value = d.value + d.inbox - dp.take
		default:
			dp.short = true
		}
	}
	return places, order
}

// commitDirectOnce sends one transaction for batch and returns the
// requests to send again.
func (e *Engine) commitDirectOnce(ctx context.Context, batch []*commitReq) []*commitReq {
	if err := ctx.Err(); err != nil {
		for _, cr := range batch {
			cr.finish(failed(fmt.Errorf("commit did not get through within %v, nothing deducted: %w", e.cfg.CommitTimeout, err)))
		}
		return nil
	}
	users, batch := e.planUsers(ctx, batch)
	if len(batch) == 0 {
		return nil
	}
	places, order := planDirect(batch)
	keep := batch[:0:0]
	for _, cr := range batch {
		switch {
		case cr.touchesDirect(places, func(dp *directPlan) bool { return dp.short }):
			cr.finish(placeResult{kind: resShort})
		case cr.ctx.Err() != nil:
			cr.finish(failed(fmt.Errorf("%w (its commit was refused by a compare and not sent again: nothing deducted)", context.Cause(cr.ctx))))
		case cr.attempts >= maxCommitAttempts:
			cr.finish(failed(fmt.Errorf("%d commits refused by compares, nothing deducted: %w", cr.attempts, ErrContention)))
		default:
			cr.attempts++
			keep = append(keep, cr)
		}
	}
	if len(keep) != len(batch) {
		// What the plan takes from places and adds to buyers included the
		// requests answered: plan again.
		return keep
	}

	var cmps []clientv3.Cmp
	var ops, diag []clientv3.Op
	for _, dp := range order {
		st := dp.st
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(dp.lockPfx), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.ModRevision(st.key), "=", dp.mod))
		ops = append(ops, clientv3.OpPut(st.key, EncodeCounter(dp.value)))
		if dp.absorb {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(st.inKey), "=", dp.inMod))
			ops = append(ops, clientv3.OpPut(st.inKey, EncodeCounter(0)))
		}
		diag = append(diag, clientv3.OpGet(st.key), clientv3.OpGet(st.inKey),
			clientv3.OpGet(dp.lockPfx, clientv3.WithPrefix(), clientv3.WithCountOnly()))
	}
	resp, partsOf, err := e.sendOrders(ctx, batch, users, cmps, ops, diag)
	if err != nil {
		// The outcome is unknown: the callers retry under the same IDs to
		// learn it; the places need a look before their next direct order.
		for _, dp := range order {
			dp.st.forgetDirect()
		}
		e.settleUsers(users, 0, nil)
		for _, cr := range batch {
			cr.finish(failed(err))
		}
		return nil
	}
	if resp.Succeeded {
		rev := resp.Header.Revision
		for _, dp := range order {
			dp.st.settleDirect(dp.take, dp.n, dp.value, rev, dp.absorb)
		}
		e.settleUsers(users, rev, nil)
		for i, cr := range batch {
			cr.resolve(served(e.allocation(cr.req, partsOf[i], rev)))
		}
		return nil
	}

	// Refused: read what changed.
	rs := resp.Responses
	e.settleUsers(users, 0, rs[len(rs)-len(users):])
	raced := map[*placeState]bool{}
	for i, dp := range order {
		st := dp.st
		cnt, cntMod, err1 := decodeCounterKV(st.key, rs[3*i].GetResponseRange())
		in, inMod, err2 := decodeCounterKV(st.inKey, rs[3*i+1].GetResponseRange())
		if rs[3*i+2].GetResponseRange().GetCount() > 0 || err1 != nil || err2 != nil {
			raced[st] = true
			st.forgetDirect()
			continue
		}
		st.mu.Lock()
		moved := cntMod != dp.mod || (dp.absorb && inMod != dp.inMod)
		st.seeDirectLocked(cnt, cntMod, in, inMod)
		st.mu.Unlock()
		if moved {
			raced[st] = true
		}
	}
	next := 3 * len(order)
	again := batch[:0:0]
	for _, cr := range batch {
		idx := rs[next].GetResponseRange().GetKvs()
		next++
		switch {
		case len(idx) > 0:
			cr.finish(result(e.replay(ctx, cr.req, idx[0])))
		case cr.touchesDirect(places, func(dp *directPlan) bool { return raced[dp.st] }):
			// Another process sells there (or took the lock): this one
			// moves elsewhere rather than race it again.
			cr.finish(placeResult{kind: resShort, raced: true})
		default:
			again = append(again, cr)
		}
	}
	return again
}

// touchesDirect reports whether any of r's direct places satisfies f.
func (r *commitReq) touchesDirect(places map[*placeState]*directPlan, f func(*directPlan) bool) bool {
	for _, p := range r.parts {
		if dp := places[p.st]; dp != nil && f(dp) {
			return true
		}
	}
	return false
}
