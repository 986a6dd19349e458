package coordinator

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/segments"
)

// Released is the outcome of a release.
type Released struct {
	SKU   string
	Order string
	Qty   int64
	Parts []segments.Part
	// Released is false when the order had already been released: nothing
	// was returned by this call.
	Released bool
	// Revision is the revision of the release (of the earlier one when
	// Released is false).
	Revision int64
}

// Release returns an order's stock to the places it came from and marks the
// order released, in one transaction: a segment's units go to its inbox
// (which counts as the segment's stock at once, see Refill), the pool's to
// the pool. It takes no segment lock (only a segment's lock holder writes
// its counter, and anyone may add to its inbox), so it never waits for, nor
// disturbs, the processes selling from those segments; it takes the pool's
// lock only for an order that took from the pool. The transaction commits
// only if the order record and every key it adds to are as read. Releasing again reports
// Released false and returns nothing; an order that was never allocated is
// ErrOrderNotFound. The order ID stays used: allocating it again replays the
// (released) first result.
func (c *Coordinator) Release(ctx context.Context, sku, order string) (out *Released, outErr error) {
	defer func() { c.metrics.released(sku, out, outErr) }()
	if err := firstErr(segments.ValidateSKU(sku), segments.ValidateOrderID(order)); err != nil {
		return nil, fmt.Errorf("release %s order %q: %w", sku, order, err)
	}
	info, err := c.sku(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("release %s order %q: %w", sku, order, err)
	}
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		r, retry, err := c.releaseOnce(ctx, info, order)
		if err != nil {
			return nil, fmt.Errorf("release %s order %q: %w", sku, order, err)
		}
		if !retry {
			return r, nil
		}
	}
	return nil, fmt.Errorf("release %s order %q: %w", sku, order, errContention)
}

func (c *Coordinator) releaseOnce(ctx context.Context, info *skuInfo, order string) (r *Released, retry bool, err error) {
	o, kv, err := c.readOrder(ctx, info.name, order)
	if err != nil {
		return nil, false, err
	}
	r = &Released{SKU: o.SKU, Order: o.ID, Qty: o.Qty, Parts: o.Parts, Revision: kv.ModRevision}
	if o.Released {
		return r, false, nil
	}
	// Where each part goes back to: a segment's inbox, or the pool.
	give := map[string]int64{}
	var targets []string
	for _, p := range o.Parts {
		if p.Place.Index() >= info.segments {
			return nil, false, &segments.CorruptError{Key: string(kv.Key), Value: kv.Value,
				Err: fmt.Errorf("part from %v of a SKU with %d segments", p.Place, info.segments)}
		}
		key := c.keys.Pool(info.name)
		if !p.Place.IsPool() {
			key = c.keys.Inbox(info.name, p.Place.Index())
		}
		if _, ok := give[key]; !ok {
			targets = append(targets, key)
		}
		give[key] += p.Qty
	}
	poolKey := c.keys.Pool(info.name)
	var poolCmps []clientv3.Cmp
	if _, ok := give[poolKey]; ok {
		hp, err := c.lockPlace(ctx, info.name, segments.Pool, -1, nil)
		if err != nil {
			return nil, false, err
		}
		defer hp.unlock()
		poolCmps = append(poolCmps, hp.h.isOwner())
		defer hp.invalidate() // the pool changes under this lock, not through its cache
	}
	reads := make([]clientv3.Op, len(targets))
	for i, key := range targets {
		reads[i] = clientv3.OpGet(key)
	}
	cur, err := c.kv.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		return nil, false, err
	}
	orderKey := string(kv.Key)
	cmps := append(poolCmps, clientv3.Compare(clientv3.ModRevision(orderKey), "=", kv.ModRevision))
	var ops []clientv3.Op
	for i, key := range targets {
		v, mod, err := decodeCounterKV(key, cur.Responses[i].GetResponseRange())
		if err != nil {
			return nil, false, err
		}
		if v+give[key] > segments.MaxTotal {
			return nil, false, fmt.Errorf("%w: returning %d to %s would exceed the maximum", ErrCorrupt, give[key], key)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", mod))
		ops = append(ops, clientv3.OpPut(key, segments.EncodeCounter(v+give[key])))
	}
	o.Released = true
	ops = append(ops, clientv3.OpPut(orderKey, segments.EncodeOrder(o)))
	resp, err := c.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, false, err
	}
	if !resp.Succeeded {
		// The order or a counter changed, or the pool's lock was lost:
		// read again.
		return nil, true, nil
	}
	r.Released, r.Revision = true, resp.Header.Revision
	return r, false, nil
}
