package segments

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The direct committer (see direct.go for why). It works as the committer
// does (commit.go): every direct order waiting at that moment, of every
// SKU, goes in one transaction, up to two transactions in flight when
// their places, buyers and order IDs are disjoint. Every place is a segment
// this process owns for lazy sales (takeDirect): per place the transaction
// compares that the counter is at the ModRevision the ownership holds at
// (and, when the orders need the inbox too, the inbox's); it writes the
// counter only when the place is due a settle (settleDue) or absorbs its
// inbox. Otherwise an order costs its record alone: one key. Per order and
// per buyer it is the committer's own compares and puts.
//
// A refused transaction's Else branch reads every place's counter and
// inbox, and every order's record. Orders whose record exists get the
// first result (a replay); orders on a place whose counter moved (a lock
// holder marked it, another process took it over) or that no longer holds
// their units are answered resShort (they climb the ladder: nothing was
// deducted); the rest are sent again, on the caches refreshed from what
// the Else branch read, while their callers' ctx lasts, up to
// maxCommitAttempts.

// settleEvery is how many lazy sales a place makes before its counter is
// written again: it bounds the records a look, a Status or a lock holder
// taking the segment reads to count them.
const settleEvery = 64

// settleDue reports whether a direct commit writes the place's counter:
// when it absorbs the inbox, empties the place, takes it below the SKU's
// low watermark (so the rebalancer, which reads counters, sees it run
// low), or ends settleEvery lazy sales.
func (dp *directPlan) settleDue(before int64, unsettled int) bool {
	return dp.absorb || dp.value == 0 || (before >= dp.lowWatermark && dp.value < dp.lowWatermark) ||
		unsettled+dp.n >= settleEvery
}

// directPlaceCost is what a direct place costs a transaction: up to three
// compares (the counter, the inbox, and the lock's range when not lazy),
// two puts (the counter, an absorb), up to three reads in the Else branch
// (the counter, the inbox, the lock's keys when not lazy).
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
	st           *placeState
	sku          *skuInfo
	lowWatermark int64
	take         int64
	n            int
	value        int64 // the place's units after the batch
	mod          int64 // the counter's expected ModRevision
	owner        int64
	absorb       bool
	inMod        int64
	settle       bool           // the batch writes the counter
	lazy         bool           // the place is sold lazily (else its counter is written with every commit, its lock's range compared empty)
	written      SegmentCounter // the counter the batch writes, when settle
	lockPfx      string
	short        bool // the cache does not show the batch's units there (or the place is not owned)
}

// hotPlace is how many orders of one direct batch make a place hot: a
// batch that carries that many orders there writes the counter exact and
// without an owner, at a cost of at most 1/hotPlace keys an order, rather
// than sell there lazily. A lazy segment costs every reader of its SKU a
// read of the records since its base (a look, a lock holder taking it, a
// Status), and etcd scans every record of the SKU to answer it; a SKU sold
// in batches that large gains nothing from it. Lazy sales pay where a
// commit carries few orders of each place: many SKUs.
const hotPlace = 8

// hotFor is how long a SKU stays hot in a process once one of its direct
// batches carried hotPlace orders of it: its segments are written exact
// and ownerless meanwhile, even by smaller batches. A claim by a small
// batch between two large ones would cost the other processes selling
// the SKU a takeover each, and their orders a race lost.
const hotFor = 10 * time.Second

// planDirect works out each place's new counter from its direct cache,
// and how the batch sells there. Without lazy segments every place is
// written with every commit. With them a place is sold in one of three
// ways:
//   - owned by this process (its counter names it): lazily, the counter
//     written only when a settle is due, or at once, exact and without
//     an owner, when the batch makes the place hot;
//   - exact and owned by nobody: the batch writes the counter, as without
//     lazy segments (the lock's range compared empty), and, unless the
//     batch makes the place hot, names this process as its owner in the
//     same write: the place is taken without a transaction of its own,
//     and no sale is missed (an exact counter has none unsettled);
//   - lazy under another owner, or with unsettled sales: short here
//     (takeDirects takes such places over before planning).
func planDirect(batch []*commitReq, lazy bool, self int64) (map[*placeState]*directPlan, []*directPlan) {
	places := map[*placeState]*directPlan{}
	var order []*directPlan
	for _, cr := range batch {
		for _, p := range cr.parts {
			dp := places[p.st]
			if dp == nil {
				dp = &directPlan{st: p.st, sku: cr.req.sku, lowWatermark: p.lowWatermark, lockPfx: p.lockPfx}
				places[p.st] = dp
				order = append(order, dp)
			}
			dp.take += p.qty
			dp.n++
		}
	}
	var now int64
	if lazy {
		// Only a lazy engine asks whether a SKU is hot.
		now = time.Now().UnixNano()
		perSKU := map[*skuInfo]int{}
		for _, cr := range batch {
			perSKU[cr.req.sku]++
		}
		for info, n := range perSKU {
			if n >= hotPlace {
				info.hotUntil.Store(now + int64(hotFor))
			}
		}
	}
	for _, dp := range order {
		st := dp.st
		st.mu.Lock()
		d := st.direct
		st.mu.Unlock()
		dp.mod, dp.owner = d.mod, d.owner
		owned := d.known && d.owned && d.owner == self
		claim := lazy && d.known && !owned && !d.raw.Lazy()
		switch {
		case !d.known || (lazy && !owned && !claim):
			dp.short = true
		case d.value >= dp.take:
			dp.value = d.value - dp.take
		case d.value+d.inbox >= dp.take:
			dp.absorb, dp.inMod = true, d.inMod
			dp.value = d.value + d.inbox - dp.take
		default:
			dp.short = true
		}
		hot := lazy && (dp.n >= hotPlace || now < dp.sku.hotUntil.Load())
		dp.lazy = lazy && owned
		switch {
		case !dp.lazy:
			// Written with the batch: exact, or (a claim of a cold place)
			// naming this process.
			dp.settle = true
			dp.written = SegmentCounter{N: dp.value}
			if claim && !hot {
				dp.written.Owner, dp.owner = self, self
			}
		case !dp.short && (hot || dp.settleDue(d.value, d.unsettled)):
			dp.settle = true
			dp.written = SegmentCounter{N: dp.value}
			if !hot {
				dp.written.Owner = self
			}
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
	if e.cfg.LazySegments {
		if again, taken := e.takeDirects(ctx, batch); !taken {
			e.settleUsers(users, 0, nil)
			return again
		}
	}
	places, order := planDirect(batch, e.cfg.LazySegments, e.owner)
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
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(st.key), "=", dp.mod))
		if !dp.lazy {
			// Not sold lazily: the segment must have no lock key (a
			// holder's cache is exact only while nobody else writes).
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(dp.lockPfx), "=", 0).WithPrefix())
		}
		if dp.settle {
			ops = append(ops, clientv3.OpPut(st.key, EncodeSegmentCounter(dp.written)))
		}
		if dp.absorb {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(st.inKey), "=", dp.inMod))
			ops = append(ops, clientv3.OpPut(st.inKey, EncodeCounter(0)))
		}
		diag = append(diag, clientv3.OpGet(st.key), clientv3.OpGet(st.inKey))
		if !dp.lazy {
			diag = append(diag, clientv3.OpGet(dp.lockPfx, clientv3.WithPrefix(), clientv3.WithCountOnly()))
		}
	}
	resp, partsOf, gone, err := e.sendOrders(ctx, batch, users, cmps, ops, diag)
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
			dp.st.settleDirect(dp.take, dp.n, dp.value, rev, dp.settle, dp.written, dp.absorb)
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
	next := 0
	for _, dp := range order {
		st := dp.st
		_, cntMod, err1 := decodeCounterKV(st.key, rs[next].GetResponseRange())
		in, inMod, err2 := decodeCounterKV(st.inKey, rs[next+1].GetResponseRange())
		next += 2
		locked := false
		if !dp.lazy {
			locked = rs[next].GetResponseRange().GetCount() > 0
			next++
		}
		if cntMod != dp.mod || locked || err1 != nil || err2 != nil {
			// Somebody else wrote the counter (a lock holder marked
			// it, another process took it over) or, not lazy, took the
			// lock: this process's direct sales there are over; it
			// moves elsewhere.
			raced[st] = true
			st.forgetDirect()
			continue
		}
		st.mu.Lock()
		st.seeDirectInboxLocked(in, inMod)
		st.mu.Unlock()
	}
	again := batch[:0:0]
	for _, cr := range batch {
		idx := rs[next].GetResponseRange().GetKvs()
		next++
		switch {
		case gone[cr.req.sku] != nil && len(idx) == 0:
			cr.finish(failed(gone[cr.req.sku]))
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

// takeDirects takes over the places of batch this process does not own yet
// (takeDirect), once each, after the buyers' limits have been judged: an
// order refused there writes nothing. Orders on a place that could not be
// taken are answered resShort (they climb the ladder); if any was, taken
// is false and again holds the rest, to be planned afresh.
func (e *Engine) takeDirects(ctx context.Context, batch []*commitReq) (again []*commitReq, taken bool) {
	lost := map[*placeState]error{}
	seen := map[*placeState]bool{}
	var todo []*takeover
	for _, cr := range batch {
		for _, p := range cr.parts {
			if seen[p.st] {
				continue
			}
			seen[p.st] = true
			p.st.mu.Lock()
			d := p.st.direct
			p.st.mu.Unlock()
			switch {
			case d.known && d.owned && d.owner == e.owner:
			case d.known && !d.raw.Lazy():
				// Exact and owned by nobody: the commit itself claims it
				// (planDirect).
			case !d.known:
				lost[p.st] = nil
			default:
				todo = append(todo, e.newTakeover(cr.req.sku, p.st, d))
			}
		}
	}
	// The takeovers go together, in transactions of up to MaxTxnOps
	// compares and ops; a refused one is tried place by place.
	per := max(1, e.cfg.MaxTxnOps/4)
	for len(todo) > 0 {
		chunk := todo[:min(per, len(todo))]
		todo = todo[len(chunk):]
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		opsOf := make([]int, len(chunk)) // each takeover's share of ops
		for i, t := range chunk {
			tops := t.ops()
			cmps, ops, opsOf[i] = append(cmps, t.cmps()...), append(ops, tops...), len(tops)
		}
		resp, err := e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
		switch {
		case err != nil:
			for _, t := range chunk {
				t.st.forgetDirect()
				lost[t.st] = fmt.Errorf("take over %s: %w", t.st.key, err)
			}
		case resp.Succeeded:
			next := 0
			for i, t := range chunk {
				if err := t.apply(resp.Responses[next:next+opsOf[i]], resp.Header.Revision); err != nil {
					lost[t.st] = err
				}
				next += opsOf[i]
			}
		default:
			for _, t := range chunk {
				if owned, err := e.takeDirect(ctx, t.info, t.st); err != nil || !owned {
					lost[t.st] = err
				}
			}
		}
	}
	if len(lost) == 0 {
		return batch, true
	}
	for _, cr := range batch {
		var hit bool
		var err error
		for _, p := range cr.parts {
			if e2, ok := lost[p.st]; ok {
				hit, err = true, cmp.Or(err, e2)
			}
		}
		switch {
		case hit && err != nil:
			cr.finish(failed(err))
		case hit:
			cr.finish(placeResult{kind: resShort, raced: true})
		default:
			again = append(again, cr)
		}
	}
	return again, false
}
