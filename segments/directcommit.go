package segments

import (
	"cmp"
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Direct places (direct.go) in the committer (committer.go): how a batch
// sells at a segment this process sells from without its lock (planDirect),
// when it writes the counter (settleDue), and taking such segments over
// from another process before planning (takeDirects).

// settleEvery is how many lazy sales a place makes before its counter is
// written again: it bounds the records a look, a Status or a lock holder
// taking the segment reads to count them.
const settleEvery = 64

// settleDue reports whether a direct commit writes the place's counter:
// when it absorbs the inbox, empties the place, takes it below the SKU's
// low watermark (so the rebalancer, which reads counters, sees it run
// low), or ends settleEvery lazy sales.
func (pp *placePlan) settleDue(before int64, unsettled int) bool {
	return pp.absorb || pp.value == 0 || (before >= pp.lowWatermark && pp.value < pp.lowWatermark) ||
		unsettled+pp.n >= settleEvery
}

// directPlaceCost is what a direct place costs a transaction: up to three
// compares (the counter, the inbox, and the lock's range when not lazy),
// two puts (the counter, an absorb), up to three reads in the Else branch
// (the counter, the inbox, the lock's keys when not lazy).
var directPlaceCost = opCost{cmps: 3, puts: 2, gets: 3}

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

// planDirect works out a direct place's new counter from its direct
// cache, and how the batch sells there. Without lazy segments every place
// is written with every commit. With them a place is sold in one of three
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
//
// now is the time the SKU's hotness is judged at (lazy engines only).
func (pp *placePlan) planDirect(lazy bool, self, now int64) {
	st := pp.st
	st.mu.Lock()
	d := st.direct
	st.mu.Unlock()
	pp.mod, pp.owner = d.mod, d.owner
	owned := d.known && d.owned && d.owner == self
	claim := lazy && d.known && !owned && !d.raw.Lazy()
	switch {
	case !d.known || (lazy && !owned && !claim):
		pp.short = true
	case d.value >= pp.take:
		pp.value = d.value - pp.take
	case d.value+d.inbox >= pp.take:
		pp.absorb, pp.inMod = true, d.inMod
		pp.value = d.value + d.inbox - pp.take
	default:
		pp.short = true
	}
	hot := lazy && (pp.n >= hotPlace || now < pp.sku.hotUntil.Load())
	pp.lazy = lazy && owned
	switch {
	case !pp.lazy:
		// Written with the batch: exact, or (a claim of a cold place)
		// naming this process.
		pp.settle = true
		pp.written = SegmentCounter{N: pp.value}
		if claim && !hot {
			pp.written.Owner, pp.owner = self, self
		}
	case !pp.short && (hot || pp.settleDue(d.value, d.unsettled)):
		pp.settle = true
		pp.written = SegmentCounter{N: pp.value}
		if !hot {
			pp.written.Owner = self
		}
	}
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
			if !p.direct || seen[p.st] {
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
