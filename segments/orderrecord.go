package segments

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// replay answers a request whose order record exists already (kv is the
// record, as read): the first result if the quantity, kind and buyer match,
// ErrConflict if not. The record is the order ID's claim: an ID is unique
// per SKU.
func (e *Engine) replay(ctx context.Context, req *allocReq, kv *mvccpb.KeyValue) (*Allocation, error) {
	o, err := DecodeOrder(string(kv.Key), kv.Value)
	if err != nil {
		return nil, err
	}
	if o.SKU != req.sku.name || o.ID != req.order {
		return nil, &CorruptError{Key: string(kv.Key), Value: kv.Value,
			Err: fmt.Errorf("record names SKU %q order %q", o.SKU, o.ID)}
	}
	if o.IsPruned() {
		// Applied once, archived since: the claim Prune kept refuses it.
		return nil, &OrderPrunedError{SKU: o.SKU, Order: o.ID, Pruned: o.PrunedAt}
	}
	if o.Lines != nil {
		return nil, fmt.Errorf("%w: the order ID was already used for an order of the lines %v", ErrConflict, o.Lines)
	}
	if o.Qty != req.qty {
		return nil, fmt.Errorf("%w: the order was already applied with qty %d, not %d", ErrConflict, o.Qty, req.qty)
	}
	if reservation := o.State != ""; reservation != (req.ttl > 0) {
		what := "a plain allocation"
		if reservation {
			what = "a reservation"
		}
		return nil, fmt.Errorf("%w: the order was already applied as %s", ErrConflict, what)
	}
	if o.Buyer != req.buyer {
		return nil, fmt.Errorf("%w: the order was already applied for buyer %q, not %q", ErrConflict, o.Buyer, req.buyer)
	}
	return &Allocation{
		SKU: o.SKU, Order: o.ID, Qty: o.Qty, Parts: o.Parts,
		Revision: kv.CreateRevision, Replayed: true, Released: o.Released,
		State: o.State, Deadline: o.Deadline, Buyer: o.Buyer,
	}, nil
}

// readOrder reads and decodes an order record: ErrOrderNotFound if there
// is none, an *OrderPrunedError if Prune left only its claim.
func (e *Engine) readOrder(ctx context.Context, sku, order string) (Order, *mvccpb.KeyValue, error) {
	key := e.keys.Order(sku, order)
	resp, err := e.kv.Get(ctx, key)
	if err != nil {
		return Order{}, nil, fmt.Errorf("read order: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Order{}, nil, ErrOrderNotFound
	}
	o, err := DecodeOrder(key, resp.Kvs[0].Value)
	if err != nil {
		return Order{}, nil, err
	}
	if o.SKU != sku || o.ID != order {
		return Order{}, nil, &CorruptError{Key: key, Value: resp.Kvs[0].Value,
			Err: fmt.Errorf("record names SKU %q order %q", o.SKU, o.ID)}
	}
	if o.IsPruned() {
		return Order{}, nil, &OrderPrunedError{SKU: o.SKU, Order: o.ID, Pruned: o.PrunedAt}
	}
	return o, resp.Kvs[0], nil
}

// OrderRecord reads the record of order at sku: ErrOrderNotFound if there
// is none, an *OrderPrunedError if Prune left only its claim.
func (e *Engine) OrderRecord(ctx context.Context, sku, order string) (Order, error) {
	o, _, err := e.readOrder(ctx, sku, order)
	return o, err
}

// orderAbsent is the compare that makes an allocation apply once per order
// ID: its record is its claim, one key per order.
func (e *Engine) orderAbsent(sku, order string) clientv3.Cmp {
	return recordAbsent(e.keys.Order(sku, order))
}

// recordAbsent compares that the order record at key does not exist.
func recordAbsent(key string) clientv3.Cmp {
	return revisionIs(clientv3.CreateRevision(key), 0)
}

// orderKey is the key of an order's record, which is also its ID's claim.
func (e *Engine) orderKey(req *allocReq) string { return e.keys.Order(req.sku.name, req.order) }

// orderPuts are the writes that record an allocation: the order record
// under its SKU, which is also the order ID's claim (and, for a
// reservation, its index key).
//
// A reservation's deadline is taken here, from this process's clock as the
// commit is built (the transaction is sent right after): the sweeper and
// Confirm judge it by their own clocks, so a skew between hosts lengthens
// or shortens a reservation by that skew, never more. Its index key is put
// in the same transaction, so every live reservation has one.
// appendOrderPuts adds to ops the writes that record an allocation, its
// record at key (orderPuts above).
func (e *Engine) appendOrderPuts(ops []clientv3.Op, key string, req *allocReq, parts []Part) []clientv3.Op {
	now := time.Now().UTC()
	rec := Order{SKU: req.sku.name, ID: req.order, Qty: req.qty, Parts: parts, Created: now,
		Buyer: req.buyer, UserCounted: req.userKey != ""}
	if req.ttl > 0 {
		req.deadline = now.Add(req.ttl)
		rec.State, rec.Deadline = StateReserved, req.deadline
		ops = append(ops, clientv3.OpPut(e.keys.Reservation(req.sku.name, req.deadline.UnixNano(), req.order),
			EncodeCounter(req.qty)))
	}
	return append(ops, clientv3.OpPut(key, EncodeOrder(rec)))
}

func (e *Engine) allocation(req *allocReq, parts []Part, rev int64) *Allocation {
	a := &Allocation{SKU: req.sku.name, Order: req.order, Qty: req.qty, Parts: parts, Revision: rev, Buyer: req.buyer}
	if req.ttl > 0 {
		a.State, a.Deadline = StateReserved, req.deadline
	}
	return a
}
