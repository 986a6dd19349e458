package segments

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// commitHeld serves req from the held places (one for a fallback place,
// several for a gather): it reserves the quantity over them in order,
// reading a segment's inbox only when its counter falls short, runs req's
// step while the places are held, and commits through the committer. The
// places are unlocked once the commit is answered.
func (e *Engine) commitHeld(ctx context.Context, held []*heldPlace, req *allocReq) placeResult {
	defer func() {
		for _, hp := range held {
			hp.unlock()
		}
	}()
	var parts []commitPart
	cancelParts := func() {
		for _, p := range parts {
			p.cancel()
		}
	}
	left := req.qty
	for _, hp := range held {
		if left == 0 {
			break
		}
		if err := hp.load(ctx, false); err != nil {
			cancelParts()
			return failed(err)
		}
		if hp.available() < left && hp.st.inKey != "" {
			if err := hp.load(ctx, true); err != nil {
				cancelParts()
				return failed(err)
			}
		}
		take := min(left, hp.available())
		if take <= 0 {
			continue
		}
		part, ok := reservePart(hp.h.Queue(), hp.h.Own(), hp.st, take)
		if !ok {
			continue
		}
		parts = append(parts, part)
		left -= take
	}
	if left > 0 {
		cancelParts()
		return placeResult{kind: resShort}
	}
	if req.step != nil {
		sctx, cancel := bindAll(ctx, held)
		err := req.step(sctx)
		cancel()
		for _, hp := range held {
			if cause := context.Cause(hp.h.Ctx()); cause != nil {
				cancelParts()
				return failed(fmt.Errorf("%w during the business step (its result: %v)", cause, err))
			}
		}
		if err != nil {
			cancelParts()
			return failed(fmt.Errorf("business step: %w", err))
		}
	}
	return e.submit(req, parts).wait(ctx)
}

// bindAll returns ctx cancelled when any of the held places' locks is lost.
func bindAll(ctx context.Context, held []*heldPlace) (context.Context, context.CancelFunc) {
	cancels := make([]context.CancelFunc, 0, len(held))
	for _, hp := range held {
		var cancel context.CancelFunc
		ctx, cancel = hp.h.Bind(ctx)
		cancels = append(cancels, cancel)
	}
	return ctx, func() {
		for _, cancel := range cancels {
			cancel()
		}
	}
}

// stillOwned reads a diagnostic Get of a hold's lock key.
func stillOwned(r *pb.ResponseOp, hp *heldPlace) bool {
	kvs := r.GetResponseRange().GetKvs()
	return len(kvs) > 0 && kvs[0].CreateRevision == hp.h.Own().Rev()
}

func result(a *Allocation, err error) placeResult {
	if err != nil {
		return failed(err)
	}
	return served(a)
}

// orderAbsent is the compare that makes an allocation apply once per order ID.
func (e *Engine) orderAbsent(order string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(e.keys.OrderID(order)), "=", 0)
}

// orderPuts are the writes that record an allocation: the global claim of
// the order ID and the order record under its SKU.
//
// A reservation's deadline is taken here, from this process's clock as the
// commit is built (the transaction is sent right after): the sweeper and
// Confirm judge it by their own clocks, so a skew between hosts lengthens
// or shortens a reservation by that skew, never more. Its index key is put
// in the same transaction, so every live reservation has one.
func (e *Engine) orderPuts(req *allocReq, parts []Part) []clientv3.Op {
	now := time.Now().UTC()
	rec := Order{SKU: req.sku.name, ID: req.order, Qty: req.qty, Parts: parts, Created: now,
		Buyer: req.buyer, UserCounted: req.userKey != ""}
	ops := []clientv3.Op{
		clientv3.OpPut(e.keys.OrderID(req.order), req.sku.name),
	}
	if req.ttl > 0 {
		req.deadline = now.Add(req.ttl)
		rec.State, rec.Deadline = StateReserved, req.deadline
		ops = append(ops, clientv3.OpPut(e.keys.Reservation(req.sku.name, req.deadline.UnixNano(), req.order),
			EncodeCounter(req.qty)))
	}
	return append(ops, clientv3.OpPut(e.keys.Order(req.sku.name, req.order), EncodeOrder(rec)))
}

func (e *Engine) allocation(req *allocReq, parts []Part, rev int64) *Allocation {
	a := &Allocation{SKU: req.sku.name, Order: req.order, Qty: req.qty, Parts: parts, Revision: rev, Buyer: req.buyer}
	if req.ttl > 0 {
		a.State, a.Deadline = StateReserved, req.deadline
	}
	return a
}
