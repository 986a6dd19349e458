package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/segments"
)

// maxCommitAttempts bounds how often one commit is retried after a compare
// failed for a reason that calls for re-reading (a deposit into an inbox
// raced the absorption, a stale cache).
const maxCommitAttempts = 8

var errContention = errors.New("coordinator: commit kept failing its compares; retry")

// commitOrder commits req from the held places (one for an ordinary
// allocation, several for a gather), running req's step first if it has one.
func (c *Coordinator) commitOrder(ctx context.Context, held []*heldPlace, req *allocReq) placeResult {
	enough, err := plan(ctx, held, req.qty)
	if err != nil {
		return failed(err)
	}
	if !enough {
		return placeResult{kind: resShort}
	}
	if req.step != nil {
		sctx, cancel := bindAll(ctx, held)
		err := req.step(sctx)
		cancel()
		for _, hp := range held {
			if cause := context.Cause(hp.h.ctx); cause != nil {
				return failed(fmt.Errorf("%w during the business step (its result: %v)", cause, err))
			}
		}
		if err != nil {
			return failed(fmt.Errorf("business step: %w", err))
		}
	}

	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		if attempt > 0 {
			if enough, err := plan(ctx, held, req.qty); err != nil {
				return failed(err)
			} else if !enough {
				return failed(fmt.Errorf("stock changed under the lock after the business step; nothing deducted: %w", errContention))
			}
		}
		var cmps []clientv3.Cmp
		var ops, diag []clientv3.Op
		var parts []segments.Part
		for _, hp := range held {
			cmps = append(cmps, hp.cmps()...)
			ops = append(ops, hp.ops()...)
			diag = append(diag, clientv3.OpGet(hp.h.own.key))
			if hp.delta < 0 {
				parts = append(parts, segments.Part{Place: hp.place(), Qty: -hp.delta})
			}
		}
		cmps = append(cmps, c.orderAbsent(req.order))
		ops = append(ops, c.orderPuts(req, parts)...)
		diag = append(diag, clientv3.OpGet(c.keys.OrderID(req.order)))

		resp, err := c.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
		if err != nil {
			for _, hp := range held {
				hp.invalidate()
			}
			return failed(err)
		}
		if resp.Succeeded {
			for _, hp := range held {
				hp.committed(resp.Header.Revision)
			}
			return served(c.allocation(req, parts, resp.Header.Revision))
		}
		for i, hp := range held {
			if !stillOwned(resp.Responses[i], hp) {
				return failed(ErrLockLost)
			}
		}
		if idx := resp.Responses[len(held)].GetResponseRange().Kvs; len(idx) > 0 {
			return result(c.replay(ctx, req, idx[0]))
		}
		for _, hp := range held {
			hp.invalidate()
		}
	}
	return failed(errContention)
}

// plan loads the held places and spreads req's qty over them in order,
// reading a segment's inbox only when its counter falls short. It reports
// whether they hold enough.
func plan(ctx context.Context, held []*heldPlace, qty int64) (bool, error) {
	left := qty
	for _, hp := range held {
		if err := hp.load(ctx, false); err != nil {
			return false, err
		}
		if hp.value < left && hp.inKey != "" {
			if err := hp.load(ctx, true); err != nil {
				return false, err
			}
		}
		take := min(left, hp.available())
		hp.delta = -take
		left -= take
	}
	return left == 0, nil
}

// bindAll returns ctx cancelled when any of the held places' locks is lost.
func bindAll(ctx context.Context, held []*heldPlace) (context.Context, context.CancelFunc) {
	cancels := make([]context.CancelFunc, 0, len(held))
	for _, hp := range held {
		var cancel context.CancelFunc
		ctx, cancel = hp.h.bind(ctx)
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
	return len(kvs) > 0 && kvs[0].CreateRevision == hp.h.own.rev
}

func result(a *Allocation, err error) placeResult {
	if err != nil {
		return failed(err)
	}
	return served(a)
}

// orderAbsent is the compare that makes an allocation apply once per order ID.
func (c *Coordinator) orderAbsent(order string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(c.keys.OrderID(order)), "=", 0)
}

// orderPuts are the writes that record an allocation: the global claim of
// the order ID and the order record under its SKU.
func (c *Coordinator) orderPuts(req *allocReq, parts []segments.Part) []clientv3.Op {
	rec := segments.Order{SKU: req.sku.name, ID: req.order, Qty: req.qty, Parts: parts, Created: time.Now().UTC()}
	return []clientv3.Op{
		clientv3.OpPut(c.keys.OrderID(req.order), req.sku.name),
		clientv3.OpPut(c.keys.Order(req.sku.name, req.order), segments.EncodeOrder(rec)),
	}
}

func (c *Coordinator) allocation(req *allocReq, parts []segments.Part, rev int64) *Allocation {
	return &Allocation{SKU: req.sku.name, Order: req.order, Qty: req.qty, Parts: parts, Revision: rev}
}
