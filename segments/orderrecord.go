package segments

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// replay answers a request whose order ID is already claimed (idx is the
// claim): the first result if the SKU and quantity match, ErrConflict if
// not.
func (e *Engine) replay(ctx context.Context, req *allocReq, idx *mvccpb.KeyValue) (*Allocation, error) {
	owner := string(idx.Value)
	if owner != req.sku.name {
		return nil, fmt.Errorf("%w: order ID %q was already used for SKU %q", ErrConflict, req.order, owner)
	}
	o, kv, err := e.readOrder(ctx, owner, req.order)
	if err != nil {
		return nil, err
	}
	if o.Qty != req.qty {
		return nil, fmt.Errorf("%w: order %q was already applied with qty %d, not %d", ErrConflict, req.order, o.Qty, req.qty)
	}
	if reservation := o.State != ""; reservation != (req.ttl > 0) {
		what := "a plain allocation"
		if reservation {
			what = "a reservation"
		}
		return nil, fmt.Errorf("%w: order %q was already applied as %s", ErrConflict, req.order, what)
	}
	if o.Buyer != req.buyer {
		return nil, fmt.Errorf("%w: order %q was already applied for buyer %q, not %q", ErrConflict, req.order, o.Buyer, req.buyer)
	}
	return &Allocation{
		SKU: o.SKU, Order: o.ID, Qty: o.Qty, Parts: o.Parts,
		Revision: kv.CreateRevision, Replayed: true, Released: o.Released,
		State: o.State, Deadline: o.Deadline, Buyer: o.Buyer,
	}, nil
}

// readOrder reads and decodes an order record.
func (e *Engine) readOrder(ctx context.Context, sku, order string) (Order, *mvccpb.KeyValue, error) {
	key := e.keys.Order(sku, order)
	resp, err := e.kv.Get(ctx, key)
	if err != nil {
		return Order{}, nil, fmt.Errorf("read order: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Order{}, nil, fmt.Errorf("%w: %q", ErrOrderNotFound, order)
	}
	o, err := DecodeOrder(key, resp.Kvs[0].Value)
	if err != nil {
		return Order{}, nil, err
	}
	if o.SKU != sku || o.ID != order {
		return Order{}, nil, &CorruptError{Key: key, Value: resp.Kvs[0].Value,
			Err: fmt.Errorf("record names SKU %q order %q", o.SKU, o.ID)}
	}
	return o, resp.Kvs[0], nil
}
