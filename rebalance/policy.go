package rebalance

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/stockctl/stockctl/coordinator"
)

// act applies the policy (see the package doc) to one SKU.
func (r *Rebalancer) act(ctx context.Context, l *leadership, v *view, pass *Pass) error {
	if err := r.refill(ctx, l, v, pass); err != nil {
		return err
	}
	drained, err := r.consolidate(ctx, l, v, pass)
	if err != nil || !drained {
		return err
	}
	// The pool has stock again: hand it to segments that ran dry.
	return r.refill(ctx, l, v, pass)
}

// refillLockWait is how long a refill waits for its SKU's pool lock. Sellers
// hold it for a pull's commit (milliseconds); a process paused or cut off
// while holding it keeps it until its lease ends (DefaultSessionTTL, 10 s),
// and the leader, acting on one SKU after another, would wait that long
// before any other SKU's refill. A refill that gives up (ErrLocked) is
// tried again in the leader's next round (actOn).
const refillLockWait = time.Second

// refill moves min(batch, pool) into every active segment below its threshold.
func (r *Rebalancer) refill(ctx context.Context, l *leadership, v *view, pass *Pass) error {
	if v.pool <= 0 {
		return nil
	}
	want := map[int]int64{}
	for i := range v.seg {
		if !v.parked[i] && v.avail(i) < v.threshold() {
			want[i] = v.meta.RefillBatch
		}
	}
	if len(want) == 0 {
		return nil
	}
	// Below the threshold as read in the move itself: sellers pull from
	// the pool and releases add to inboxes behind this view's back.
	moved, rev, err := l.c.stock.RefillBelow(ctx, v.sku, want, v.threshold(), l.refillWait, l.fence)
	if err != nil {
		return err
	}
	now := time.Now()
	for i, q := range moved {
		m := Move{SKU: v.sku, Segment: i, Kind: Refill, Qty: q, Revision: rev,
			TriggerRevision: v.crossRev[i], Leader: r.cfg.Identity}
		if !v.crossedAt[i].IsZero() {
			m.Latency = now.Sub(v.crossedAt[i])
		}
		v.in[i] += q
		v.inRev[i] = rev
		v.pool -= q
		v.changed[i] = now
		v.observe(i, rev, now)
		r.moved(pass, m)
	}
	if len(moved) > 0 {
		v.poolRev = rev
	}
	return nil
}

// consolidate drains idle segments into the pool when the pool is empty
// and some segment has run dry. It reports whether anything was drained.
//
// Idle segments that are dry are parked too, as drained ones are: nobody
// buys there either, so the drained stock must not be refilled into them.
// Before (issue 28), it was: the refill after the drain moved the last units
// into the first dry segment, which went idle in turn and was drained and
// its units refilled into the next, one segment every IdleAfter through
// every segment of the SKU, after every election. A parked segment is
// unparked by any change of its counters not made by this leader (view.set):
// traffic (a seller pulling from the pool) or stock returned to it.
//
// A drain refused because the segment's lock is busy (ErrLocked after
// DrainWait) leaves the segment pending: once the pool holds the other
// segments' stock, only pending segments are drained, each once it is idle
// again. Without that, a drain that lost the race for a lock (on a starved
// machine an idle lock can take longer than DrainWait) after another
// drain had filled the pool was never tried again, and its units stayed
// in the segment (found by a busy-machine run of
// TestEndOfSaleConsolidation; TestBusyDrainRetriedAfterThePoolFilled).
func (r *Rebalancer) consolidate(ctx context.Context, l *leadership, v *view, pass *Pass) (bool, error) {
	// Once the pool holds stock, consolidating is over but for the
	// pending drains (decided once: the drains below fill the pool).
	pendingOnly := v.pool > 0
	if pendingOnly {
		if !slices.Contains(v.drainPending, true) {
			return false, nil
		}
	} else if !v.anyDry() {
		return false, nil
	}
	now := time.Now()
	drained := false
	for i := range v.seg {
		if pendingOnly && !v.drainPending[i] {
			continue
		}
		if !v.forceIdle && now.Sub(v.changed[i]) < r.cfg.IdleAfter {
			continue
		}
		if v.avail(i) == 0 {
			v.parked[i], v.drainPending[i] = true, false
			continue
		}
		moved, rev, err := l.c.stock.Drain(ctx, v.sku, i, r.cfg.DrainWait, l.fence)
		if errors.Is(err, coordinator.ErrLocked) {
			v.drainPending[i] = true // busy: not idle after all; try again once it is
			continue
		}
		if err != nil {
			return drained, err
		}
		v.drainPending[i] = false
		if moved == 0 {
			continue
		}
		drained = true
		v.seg[i], v.in[i], v.segRev[i], v.inRev[i] = 0, 0, rev, rev
		v.pool += moved
		v.poolRev = rev
		v.parked[i] = true
		v.changed[i] = time.Now()
		v.observe(i, rev, now)
		r.moved(pass, Move{SKU: v.sku, Segment: i, Kind: Drain, Qty: moved, Revision: rev, Leader: r.cfg.Identity})
	}
	return drained, nil
}

func (r *Rebalancer) moved(pass *Pass, m Move) {
	pass.Moves = append(pass.Moves, m)
	pass.Revision = max(pass.Revision, m.Revision)
	r.metrics.moves.WithLabelValues(m.Kind.String()).Inc()
	if m.Kind == Refill && m.Latency > 0 {
		r.metrics.refillLag.Observe(m.Latency.Seconds())
	}
	if r.cfg.OnMove != nil {
		r.cfg.OnMove(m)
	}
}
