package rebalance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

var errUnknownSKU = coordinator.ErrUnknownSKU

// lead keeps every SKU stocked until ctx ends (with the term).
func (r *Rebalancer) lead(ctx context.Context, l *leadership) error {
	// Expired reservations are swept beside the stock watch; a sweep that
	// finds the leadership gone ends the term.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	swept := make(chan struct{})
	defer func() { cancel(nil); <-swept }()
	go func() {
		defer close(swept)
		if err := r.sweepExpired(ctx, l); err != nil && isFatal(err) {
			cancel(err)
		}
	}()
	for {
		err := r.watchAndAct(ctx, l)
		if cause := context.Cause(ctx); cause != nil && isFatal(cause) {
			return cause
		}
		if ctx.Err() != nil || isFatal(err) {
			return err
		}
		// The watch broke (compaction, a restarted member): start over
		// from a fresh read.
		r.log.Debug("rebalancer watch restarted", "err", err)
	}
}

// isFatal reports errors that end the term: leadership or the session is gone.
func isFatal(err error) bool {
	return errors.Is(err, segments.ErrFenced) || errors.Is(err, coordinator.ErrSessionLost) ||
		errors.Is(err, coordinator.ErrLockLost) || errors.Is(err, coordinator.ErrClosed)
}

func (r *Rebalancer) watchAndAct(ctx context.Context, l *leadership) error {
	r.watching.Store(false) // until this read of every SKU is acted on
	views, rev, err := l.loadAll(ctx)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	k := l.c.keys
	stock := newWatchQueue(wctx, l.c.client.Watch(wctx, k.StockPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1)))
	metas := l.c.client.Watch(wctx, k.MetaPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	sweep := time.NewTicker(r.cfg.SweepInterval)
	defer sweep.Stop()

	dirty := map[*view]bool{}
	for _, v := range views {
		dirty[v] = true
	}
	next := "" // the safety net's next SKU (sweepWindow)
	for {
		busy, err := r.actOn(ctx, l, dirty)
		if err != nil {
			return err
		}
		r.watching.Store(true)
		clear(dirty)
		// A SKU whose pool lock was busy is acted on again next round,
		// by name: a sweep may have replaced its view meanwhile.
		for _, sku := range busy {
			if v := views[sku]; v != nil {
				dirty[v] = true
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stock.ready:
			// Apply every response received before acting: in a busy sale
			// the counters change thousands of times a second, and acting
			// between each would let a crossing queue behind stale events.
			rs, err := stock.take()
			for _, r := range rs {
				for _, ev := range r.resp.Events {
					if v := applyStock(k, views, ev.Kv, r.at); v != nil {
						dirty[v] = true
					}
				}
			}
			if err != nil {
				return fmt.Errorf("stock watch ended: %w", err)
			}
		case wr, ok := <-metas:
			if !ok || wr.Err() != nil {
				return fmt.Errorf("meta watch ended: %v", wr.Err())
			}
			for _, ev := range wr.Events {
				if v := r.applyMeta(ctx, l, views, ev); v != nil {
					dirty[v] = true
				}
			}
		case <-sweep.C:
			// The safety net: read a slice of the SKUs again (they go
			// round, sweepSKUs a tick), keeping what only this leader
			// knows (parked segments, crossing times).
			var names []string
			names, next = sweepWindow(views, next)
			fresh, err := l.loadSome(ctx, names)
			if err != nil {
				return err
			}
			for sku, f := range fresh {
				if old := views[sku]; old != nil && old.meta.Segments == f.meta.Segments {
					f.parked, f.drainPending, f.crossedAt, f.crossRev, f.changed, f.below = old.parked, old.drainPending, old.crossedAt, old.crossRev, old.changed, old.below
					for i := range f.seg {
						if f.avail(i) != old.avail(i) {
							f.changed[i] = time.Now()
						}
						f.observe(i, max(f.segRev[i], f.inRev[i]), time.Now())
					}
				}
				views[sku] = f
				dirty[f] = true
			}
			for _, sku := range names {
				if fresh[sku] == nil {
					delete(views, sku)
				}
			}
		}
	}
}

// applyMeta handles a change of a SKU's meta record: a new SKU, a restock,
// a new policy, or a deletion.
func (r *Rebalancer) applyMeta(ctx context.Context, l *leadership, views map[string]*view, ev *clientv3.Event) *view {
	sku, err := l.c.keys.ParseMeta(string(ev.Kv.Key))
	if err != nil {
		return nil
	}
	if ev.Type == mvccpb.DELETE {
		delete(views, sku)
		return nil
	}
	nv := l.viewFromMeta(ev.Kv, time.Now())
	if nv == nil {
		return nil
	}
	old := views[sku]
	if old == nil || old.meta.Segments != nv.meta.Segments {
		// A new SKU: read its counters.
		v, err := l.load(ctx, sku)
		if err != nil {
			r.log.Warn("rebalancer cannot load a new SKU", "sku", sku, "err", err)
			return nil
		}
		views[sku] = v
		return v
	}
	if nv.meta.Total > old.meta.Total {
		clear(old.parked) // a restock opens a new phase of the sale
		clear(old.drainPending)
	}
	old.meta = nv.meta
	now := time.Now()
	for i := range old.seg {
		old.observe(i, ev.Kv.ModRevision, now)
	}
	return old
}

// actOn runs the policy on each dirty view and records the pass if it moved
// anything. It returns the SKUs whose pool lock another process held past
// refillLockWait, to be acted on again.
func (r *Rebalancer) actOn(ctx context.Context, l *leadership, dirty map[*view]bool) (busy []string, err error) {
	if len(dirty) == 0 {
		return nil, nil
	}
	pass := &Pass{Leader: r.cfg.Identity}
	for v := range dirty {
		if err := r.act(ctx, l, v, pass); err != nil {
			if isFatal(err) || ctx.Err() != nil {
				return nil, err
			}
			if errors.Is(err, coordinator.ErrLocked) {
				r.log.Debug("rebalancer: a pool lock is busy, trying again next round", "sku", v.sku)
				busy = append(busy, v.sku)
				continue
			}
			r.metrics.failedMoves.Inc()
			r.log.Warn("rebalancer move failed", "sku", v.sku, "err", err)
		}
	}
	if len(pass.Moves) == 0 {
		return busy, nil
	}
	return busy, r.record(ctx, l, pass)
}

// sweepWindow picks the next sweepSKUs SKUs of views in name order, from
// the first at or after from (round to the start at the end), and where
// the following window starts.
func sweepWindow(views map[string]*view, from string) (names []string, next string) {
	all := slices.Sorted(maps.Keys(views))
	start, _ := slices.BinarySearch(all, from)
	for i := 0; i < min(sweepSKUs, len(all)); i++ {
		names = append(names, all[(start+i)%len(all)])
	}
	if len(all) > 0 {
		next = all[(start+len(names))%len(all)]
	}
	return names, next
}
