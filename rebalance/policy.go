package rebalance

import (
	"context"
	"errors"
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
	moved, rev, err := l.c.stock.RefillBelow(ctx, v.sku, want, v.threshold(), l.fence)
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
func (r *Rebalancer) consolidate(ctx context.Context, l *leadership, v *view, pass *Pass) (bool, error) {
	if v.pool > 0 {
		return false, nil
	}
	// A parked dry segment counts as dry too: a stocked segment that was
	// busy (its lock held: ErrLocked below) when the dry ones went idle and
	// were parked must still be drained once it is idle. Counting only
	// unparked dry segments stranded its units there for good (found on a
	// busy machine: the drain lost the race for the lock of a process that
	// had just closed, the dry segments were parked in the same pass, and
	// no pass drained again).
	dry := false
	for i := range v.seg {
		if v.avail(i) == 0 {
			dry = true
			break
		}
	}
	if !dry {
		return false, nil
	}
	now := time.Now()
	drained := false
	for i := range v.seg {
		if !v.forceIdle && now.Sub(v.changed[i]) < r.cfg.IdleAfter {
			continue
		}
		if v.avail(i) == 0 {
			v.parked[i] = true
			continue
		}
		moved, rev, err := l.c.stock.Drain(ctx, v.sku, i, r.cfg.DrainWait, l.fence)
		if errors.Is(err, coordinator.ErrLocked) {
			continue // busy: not idle after all
		}
		if err != nil {
			return drained, err
		}
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
