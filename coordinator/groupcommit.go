package coordinator

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/segments"
)

// Group commit. Plain allocations (no business step) waiting in this process
// for the same place are committed together: each one queues its request on
// the place and then waits for the place's lock. Whoever gets the lock
// claims every queued request (up to what fits in one etcd transaction),
// commits them in one fenced transaction with one order record each, and
// hands each its result; their owners then leave the lock queue without
// ever holding the lock. Under load this turns N round trips into one,
// which is what lets a hot segment go past one commit per round trip.

// pendingAlloc is one request queued on a place.
type pendingAlloc struct {
	req  *allocReq
	done chan struct{} // closed once res is set by a combiner
	res  placeResult
}

func (a *pendingAlloc) resolve(r placeResult) {
	a.res = r
	close(a.done)
}

// maxGroup is the largest group that fits etcd's --max-txn-ops: each order
// needs one compare and two puts, and the place adds two of each.
func (c *Coordinator) maxGroup() int { return (c.opts.maxTxnOps - 2) / 2 }

func (c *Coordinator) tryPlaceGrouped(ctx context.Context, req *allocReq, p segments.Place, wait time.Duration) placeResult {
	st := c.placeState(req.sku.name, p)
	a := &pendingAlloc{req: req, done: make(chan struct{})}
	st.enqueue(a)
	hp, err := c.lockPlace(ctx, req.sku.name, p, wait, a.done)
	if err != nil {
		if st.dequeue(a) {
			return lockFailure(err)
		}
		<-a.done // claimed by a combiner: its result is on the way
		return a.res
	}
	defer hp.unlock()
	batch := st.claim(a, c.maxGroup())
	if batch == nil {
		<-a.done
		return a.res
	}
	c.commitGroup(hp, batch)
	return a.res
}

func (st *placeState) enqueue(a *pendingAlloc) {
	st.mu.Lock()
	st.pending = append(st.pending, a)
	st.mu.Unlock()
}

// dequeue removes a if no combiner claimed it yet.
func (st *placeState) dequeue(a *pendingAlloc) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, p := range st.pending {
		if p == a {
			st.pending = append(st.pending[:i], st.pending[i+1:]...)
			return true
		}
	}
	return false
}

// claim takes a and then the oldest other pending requests, up to max, off
// the queue. Two requests for the same order ID never share a group (the
// transaction would put the same key twice); the later one stays queued
// and, committed next, finds the order applied. claim returns nil if a was
// already claimed by someone else.
func (st *placeState) claim(a *pendingAlloc, max int) []*pendingAlloc {
	st.mu.Lock()
	defer st.mu.Unlock()
	found := false
	for _, p := range st.pending {
		if p == a {
			found = true
			break
		}
	}
	if !found {
		return nil
	}
	batch := []*pendingAlloc{a}
	orders := map[string]bool{a.req.order: true}
	rest := st.pending[:0]
	for _, p := range st.pending {
		if p != a && len(batch) < max && !orders[p.req.order] {
			batch = append(batch, p)
			orders[p.req.order] = true
		} else if p != a {
			rest = append(rest, p)
		}
	}
	clear(st.pending[len(rest):])
	st.pending = rest
	return batch
}

// commitGroup commits as many of batch as the place can serve, in order, in
// one transaction, and resolves every request of batch.
func (c *Coordinator) commitGroup(hp *heldPlace, batch []*pendingAlloc) {
	ctx, cancel := context.WithTimeout(c.bgCtx, c.opts.commitTimeout)
	defer cancel()
	ctx, unbind := hp.h.bind(ctx)
	defer unbind()
	resolveAll := func(r placeResult) {
		for _, a := range batch {
			a.resolve(r)
		}
	}

	for attempt := 0; len(batch) > 0; attempt++ {
		if attempt == maxCommitAttempts {
			resolveAll(failed(errContention))
			return
		}
		var need int64
		for _, a := range batch {
			need += a.req.qty
		}
		if err := hp.load(ctx, false); err != nil {
			resolveAll(failed(err))
			return
		}
		if hp.value < need && hp.inKey != "" {
			if err := hp.load(ctx, true); err != nil {
				resolveAll(failed(err))
				return
			}
		}
		avail := hp.available()
		fit := make([]*pendingAlloc, 0, len(batch))
		var take int64
		for _, a := range batch {
			if a.req.qty <= avail-take {
				fit = append(fit, a)
				take += a.req.qty
			} else {
				a.resolve(placeResult{kind: resShort})
			}
		}
		batch = fit
		if len(batch) == 0 {
			return
		}

		hp.delta = -take
		cmps := hp.cmps()
		ops := hp.ops()
		diag := []clientv3.Op{clientv3.OpGet(hp.h.own.key)}
		parts := make([][]segments.Part, len(batch))
		for i, a := range batch {
			parts[i] = []segments.Part{{Place: hp.place(), Qty: a.req.qty}}
			cmps = append(cmps, c.orderAbsent(a.req.order))
			ops = append(ops, c.orderPuts(a.req, parts[i])...)
			diag = append(diag, clientv3.OpGet(c.keys.OrderID(a.req.order)))
		}
		resp, err := c.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
		if err != nil {
			hp.invalidate()
			resolveAll(failed(err))
			return
		}
		if resp.Succeeded {
			hp.committed(resp.Header.Revision)
			for i, a := range batch {
				a.resolve(served(c.allocation(a.req, parts[i], resp.Header.Revision)))
			}
			return
		}
		if !stillOwned(resp.Responses[0], hp) {
			resolveAll(failed(ErrLockLost))
			return
		}
		// Orders already applied are replays: answer them and commit the rest.
		rest := batch[:0:0]
		for i, a := range batch {
			if idx := resp.Responses[i+1].GetResponseRange().Kvs; len(idx) > 0 {
				a.resolve(result(c.replay(ctx, a.req, idx[0])))
			} else {
				rest = append(rest, a)
			}
		}
		if len(rest) == len(batch) {
			hp.invalidate() // the counter changed: re-read it
		}
		batch = rest
	}
}
