package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"

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
// order released, in one transaction fenced by those places' locks (taken in
// the global order). Releasing again reports Released false and returns
// nothing; an order that was never allocated is ErrOrderNotFound. The order
// ID stays used: allocating it again replays the (released) first result.
func (c *Coordinator) Release(ctx context.Context, sku, order string) (*Released, error) {
	if err := firstErr(segments.ValidateSKU(sku), segments.ValidateOrderID(order)); err != nil {
		return nil, fmt.Errorf("release %s order %q: %w", sku, order, err)
	}
	info, err := c.sku(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("release %s order %q: %w", sku, order, err)
	}
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		r, retry, err := c.releaseOnce(ctx, info, order)
		if errors.Is(err, ErrLockLost) || errors.Is(err, ErrSessionLost) {
			continue // nothing was written; a new session will do
		}
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

	// Lock each place once, in the global order.
	give := map[segments.Place]int64{}
	for _, p := range o.Parts {
		if p.Place.Index() >= info.segments {
			return nil, false, &segments.CorruptError{Key: string(kv.Key), Value: kv.Value,
				Err: fmt.Errorf("part from %v of a SKU with %d segments", p.Place, info.segments)}
		}
		give[p.Place] += p.Qty
	}
	places := make([]segments.Place, 0, len(give))
	for p := range give {
		places = append(places, p)
	}
	slices.Sort(places)
	var held []*heldPlace
	defer func() {
		for _, hp := range held {
			hp.unlock()
		}
	}()
	for _, p := range places {
		hp, err := c.lockPlace(ctx, info.name, p, -1, nil)
		if err != nil {
			return nil, false, err
		}
		held = append(held, hp)
	}

	var cmps []clientv3.Cmp
	var ops, diag []clientv3.Op
	for _, hp := range held {
		if err := hp.load(ctx, false); err != nil {
			return nil, false, err
		}
		hp.delta = give[hp.place()]
		if hp.newValue() > segments.MaxTotal {
			return nil, false, fmt.Errorf("%w: returning %d to %v would exceed the maximum", ErrCorrupt, hp.delta, hp.place())
		}
		cmps = append(cmps, hp.cmps()...)
		ops = append(ops, hp.ops()...)
		diag = append(diag, clientv3.OpGet(hp.h.own.key))
	}
	o.Released = true
	orderKey := string(kv.Key)
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(orderKey), "=", kv.ModRevision))
	ops = append(ops, clientv3.OpPut(orderKey, segments.EncodeOrder(o)))
	resp, err := c.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
	if err != nil {
		for _, hp := range held {
			hp.invalidate()
		}
		return nil, false, err
	}
	if resp.Succeeded {
		for _, hp := range held {
			hp.committed(resp.Header.Revision)
		}
		r.Released, r.Revision = true, resp.Header.Revision
		return r, false, nil
	}
	for i, hp := range held {
		if !stillOwned(resp.Responses[i], hp) {
			return nil, false, ErrLockLost
		}
		hp.invalidate()
	}
	return nil, true, nil // the order or a counter changed: read again
}
