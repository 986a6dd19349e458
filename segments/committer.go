package segments

import (
	"context"
	"fmt"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/batch"
	"github.com/stockctl/stockctl/internal/lock"
)

// The committer is how an order's deduction reaches etcd. An order reserves
// its units on the place(s) it takes from (placeState.reserve, or
// reserveDirect), and hands a commitReq to a committer. The committer sends
// every request waiting at that moment, of every place and SKU of this
// process, in one transaction (commitParallel at once when they share
// nothing): for each place its fence and its writes, for each order a
// compare that its ID is unused and its record (which is the ID's claim),
// for each SKU a compare of its incarnation, for each buyer its counter.
// Under load an order costs a fraction of one etcd write, and a place's
// next order runs while the previous one's commit is in flight (its
// reservation keeps the successor from planning with those units).
//
// Every place of a transaction carries its fence: what proves, inside the
// transaction, that this process may still write it.
//   - lockFence, a held place (the orders' step ran under its lock): the
//     lock key is this process's (its CreateRevision is the hold's), and
//     the counter is at the revision last committed; the counter is
//     written with every commit.
//   - counterFence, a direct place (direct.go: a segment sold without its
//     lock): the counter is at the ModRevision this process last wrote or
//     read, and, unless this process owns it for lazy sales, the lock's
//     range is empty. A lazy place's counter is written only when a settle
//     is due; otherwise an order costs its record alone.
//
// A refused transaction is never a silent failure: its Else branch reads
// what the fences and orders compared, and the committer answers the
// orders whose place was lost (lock.ErrLost), taken by another process
// (resShort: they climb the ladder), whose SKU was deleted or replaced, or
// whose ID was already used (a replay), refreshes its caches, and sends
// the rest again while their callers wait, up to maxCommitAttempts.

// fence says how a place of a commit proves that this process may still
// write it (see above).
type fence uint8

const (
	lockFence fence = iota
	counterFence
)

// committer is one queue of orders and the group commits that send them.
// An engine has two, with the same code: held orders and direct orders, so
// that neither kind waits behind the other's transactions.
type committer struct {
	e        *Engine
	cost     opCost // what one place costs a transaction (selectOrders)
	batcher  batch.Batcher[*commitReq]
	inflight inflight // what this committer's transactions in flight hold
}

func newCommitter(e *Engine, cost opCost) *committer {
	c := &committer{e: e, cost: cost}
	c.batcher = batch.Batcher[*commitReq]{Parallel: commitParallel, Go: e.bg.Go, Select: c.selectBatch, Commit: c.commit,
		Fail: func(cr *commitReq) { cr.finish(failed(lock.ErrClosed)) }}
	return c
}

// submit hands parts of req to the committer; the caller waits on the
// returned request.
func (c *committer) submit(ctx context.Context, req *allocReq, parts []commitPart) *commitReq {
	cr := &commitReq{req: req, parts: parts, ctx: ctx, done: make(chan struct{})}
	c.batcher.Submit(cr)
	return cr
}

// selectBatch is the batcher's Select: the oldest requests that fit one
// transaction and share nothing with the transactions in flight.
func (c *committer) selectBatch(queue []*commitReq) (batch, rest []*commitReq) {
	return c.inflight.take(queue, c.e.cfg.MaxTxnOps, c.cost)
}

// commit commits batch, or answers each request of it (the batcher's
// Commit).
func (c *committer) commit(bg context.Context, batch []*commitReq) {
	defer c.inflight.unmark(slices.Clone(batch))
	for len(batch) > 0 {
		batch = c.commitGroup(bg, batch)
	}
}

// commitGroup commits batch within the commit timeout, or answers each
// request of it, except those it defers: when a transaction failed only
// because another process changed a buyer's counter meanwhile, the
// requests of that buyer are returned to be sent after the others, so that
// one buyer ordering hard from several processes at once does not make
// everyone's commit fail.
func (c *committer) commitGroup(bg context.Context, batch []*commitReq) (deferred []*commitReq) {
	ctx, cancel := context.WithTimeout(bg, c.e.cfg.CommitTimeout)
	defer cancel()
	for len(batch) > 0 {
		var later []*commitReq
		batch, later = c.commitOnce(ctx, batch)
		deferred = append(deferred, later...)
	}
	return deferred
}

// commitOnce plans batch and sends it in one transaction, answering every
// request it can; it returns the requests to plan and send again, and
// those to send after the others (commitGroup).
func (c *committer) commitOnce(ctx context.Context, batch []*commitReq) (again, deferred []*commitReq) {
	e := c.e
	if err := ctx.Err(); err != nil {
		// The commit timeout passed while planning (etcd slow or
		// unreachable): nothing of these was committed.
		for _, cr := range batch {
			cr.finish(failed(fmt.Errorf("commit did not get through within %v, nothing deducted: %w", e.cfg.CommitTimeout, err)))
		}
		return nil, nil
	}
	users, batch := e.planUsers(ctx, batch)
	if len(batch) == 0 {
		return nil, nil
	}
	if e.cfg.LazySegments && c == e.direct {
		// Direct orders only (the held committer has none), after the
		// buyers' limits: an order refused there writes nothing.
		if rest, taken := e.takeDirects(ctx, batch); !taken {
			e.settleUsers(users, 0, nil)
			return rest, nil
		}
	}
	places, order := e.planPlaces(ctx, batch)
	if keep := answerUnplannable(batch, places); len(keep) != len(batch) {
		// What the plan takes from its places and adds to its buyers
		// included the requests answered: plan again.
		return keep, nil
	}
	if absorbs := needAbsorb(order); len(absorbs) > 0 {
		// A held place's inbox is absorbed in a transaction of its own,
		// so that a release or a refill landing in it meanwhile fails only
		// that, never the batch; then the batch is planned again.
		e.absorb(ctx, absorbs)
		return batch, nil
	}

	var cmps []clientv3.Cmp
	var ops, diag []clientv3.Op
	for _, pp := range order {
		cmps, ops, diag = pp.txn(cmps, ops, diag)
	}
	resp, partsOf, gone, err := e.sendOrders(ctx, batch, users, cmps, ops, diag)
	if err != nil {
		// The outcome is unknown: the callers retry under the same IDs to
		// learn it, and the places are read again before their next use.
		for _, pp := range order {
			pp.unknown()
		}
		e.settleUsers(users, 0, nil)
		for _, cr := range batch {
			cr.finish(failed(err))
		}
		return nil, nil
	}
	if resp.Succeeded {
		rev := resp.Header.Revision
		for _, pp := range order {
			pp.committed(rev)
		}
		e.settleUsers(users, rev, nil)
		for i, cr := range batch {
			for _, p := range cr.parts {
				if !p.direct {
					p.q.Unpin(p.own)
				}
			}
			cr.resolve(served(e.allocation(cr.req, partsOf[i], rev)))
		}
		return nil, nil
	}

	// Refused: read what changed, in the order the Else branch was built
	// (sendOrders): the places, the orders' records, the SKUs, the buyers.
	rs := resp.Responses
	tail := rs[len(rs)-len(users):]
	e.settleUsers(users, 0, tail)
	again, held := e.answerRefused(ctx, batch, places, order, rs, gone)
	// The held places' counters and inboxes may have moved under the
	// plan (a direct place's were read in the Else branch).
	e.refreshPlaces(ctx, held)
	if hot := changedUsers(users, tail); len(hot) > 0 {
		var cool, later []*commitReq
		for _, cr := range again {
			if hot[cr.req.userKey] {
				later = append(later, cr)
			} else {
				cool = append(cool, cr)
			}
		}
		if len(cool) > 0 && len(later) > 0 {
			again, deferred = cool, later
		}
	}
	return again, deferred
}

// answerRefused reads a refused transaction's Else branch rs (built by
// txn and sendOrders: the places' reads, then each order's record) and
// answers every request it can: a replay when the order's record exists;
// the SKU's error when it was deleted or replaced (gone); lock.ErrLost on a
// held place whose lock is gone; resShort (raced) on a direct place another
// process took. It returns the requests to send again, and the held places
// still held, whose counters and inboxes the caller reads again (the plan
// may have been made on a cache that moved).
func (e *Engine) answerRefused(ctx context.Context, batch []*commitReq, places map[*placeState]*placePlan, order []*placePlan, rs []*pb.ResponseOp, gone map[*skuInfo]error) (again []*commitReq, held []*placePlan) {
	next := 0
	for _, pp := range order {
		next += pp.readElse(rs[next:])
		if pp.fence == lockFence && !pp.lost {
			held = append(held, pp)
		}
	}
	for _, cr := range batch {
		record := rs[next].GetResponseRange().GetKvs()
		next++
		switch {
		case len(record) > 0:
			cr.finish(result(e.replay(ctx, cr.req, record[0])))
		case gone[cr.req.sku] != nil:
			cr.finish(failed(gone[cr.req.sku]))
		case cr.touches(places, func(pp *placePlan) bool { return pp.lost }):
			cr.finish(failed(lock.ErrLost))
		case cr.touches(places, func(pp *placePlan) bool { return pp.raced }):
			// Another process sells there (or took the lock): this one
			// moves elsewhere rather than race it again.
			cr.finish(placeResult{kind: resShort, raced: true})
		default:
			again = append(again, cr)
		}
	}
	return again, held
}

// answerUnplannable answers the requests of batch that cannot be committed
// as planned: a place lost, unreadable or short (a held place holding less
// than its reservations: changed under the lock; a direct place: the order
// climbs the ladder), or refused by compares too often or past its
// caller's ctx. It returns the others, counting their attempt.
func answerUnplannable(batch []*commitReq, places map[*placeState]*placePlan) (keep []*commitReq) {
	keep = batch[:0:0]
	for _, cr := range batch {
		switch {
		case cr.touches(places, func(pp *placePlan) bool { return pp.lost }):
			cr.finish(failed(lock.ErrLost))
		case cr.touches(places, func(pp *placePlan) bool { return pp.err != nil }):
			cr.finish(failed(cr.placeErr(places)))
		case cr.touches(places, func(pp *placePlan) bool { return pp.short && pp.fence == lockFence }):
			cr.finish(failed(fmt.Errorf("stock changed under the lock after the business step; nothing deducted: %w", ErrContention)))
		case cr.touches(places, func(pp *placePlan) bool { return pp.short }):
			cr.finish(placeResult{kind: resShort})
		case cr.ctx.Err() != nil:
			cr.finish(failed(fmt.Errorf("%w (its commit was refused by a compare and not sent again: nothing deducted)", context.Cause(cr.ctx))))
		case cr.attempts >= maxCommitAttempts:
			cr.finish(failed(fmt.Errorf("%d commits refused by compares, nothing deducted: %w", cr.attempts, ErrContention)))
		default:
			cr.attempts++
			keep = append(keep, cr)
		}
	}
	return keep
}

// sendOrders sends a group commit whose places' compares, puts and Else
// reads are in cmps, ops and diag, with what every batch of orders carries
// after them: each order's absence compare, record put and record read,
// each SKU's incarnation compare and meta read, then the buyers' counters
// last (commitOnce reads the Else branch in that order). partsOf are each
// order's parts, as recorded. A refused commit's gone are the SKUs it
// found deleted or replaced (forgotten: their orders are answered with the
// error, nothing written).
func (e *Engine) sendOrders(ctx context.Context, batch []*commitReq, users []*batchUser, cmps []clientv3.Cmp, ops, diag []clientv3.Op) (resp *clientv3.TxnResponse, partsOf [][]Part, gone map[*skuInfo]error, err error) {
	partsOf = make([][]Part, len(batch))
	var skus []*skuInfo
	seen := map[*skuInfo]bool{}
	for i, cr := range batch {
		partsOf[i] = cr.segmentParts()
		cmps = append(cmps, e.orderAbsent(cr.req.sku.name, cr.req.order))
		ops = append(ops, e.orderPuts(cr.req, partsOf[i])...)
		diag = append(diag, clientv3.OpGet(e.orderKey(cr.req)))
		if !seen[cr.req.sku] && cr.req.sku.created != 0 {
			seen[cr.req.sku] = true
			skus = append(skus, cr.req.sku)
		}
	}
	metaAt := len(diag)
	for _, info := range skus {
		cmps = append(cmps, e.incarnation(info)...)
		diag = append(diag, clientv3.OpGet(e.keys.Meta(info.name), clientv3.WithKeysOnly()))
	}
	ucmps, uops, udiag := userCmpsOps(users)
	cmps, ops, diag = append(cmps, ucmps...), append(ops, uops...), append(diag, udiag...)
	sent := time.Now()
	resp, err = e.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
	e.metrics.committed(len(batch), time.Since(sent), commitOutcome(resp, err))
	if err == nil && !resp.Succeeded {
		for i, info := range skus {
			kvs := resp.Responses[metaAt+i].GetResponseRange().GetKvs()
			if len(kvs) == 1 && kvs[0].CreateRevision == info.created {
				continue
			}
			e.forgetSKU(info)
			if gone == nil {
				gone = map[*skuInfo]error{}
			}
			gone[info] = skuGoneErr(info, len(kvs) == 0)
		}
	}
	return resp, partsOf, gone, err
}

// commitOutcome labels a group commit's round trip for the metrics.
func commitOutcome(resp *clientv3.TxnResponse, err error) string {
	switch {
	case err != nil:
		return "error"
	case resp.Succeeded:
		return "committed"
	}
	return "refused"
}
