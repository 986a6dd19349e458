package segments

import (
	"context"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/lock"
)

// The committer is how an order's deduction reaches etcd. An order reserves
// its units on the place(s) it takes from (placeState.reserve) while it
// holds their locks, runs its business step, and hands a commitReq to the
// committer. The committer sends every request waiting at that moment, of
// every place and SKU of this process, in one transaction: for each place
// a compare that this process still holds its lock (the fence) and that
// the counter is as last committed, and the counter's new value; for each
// order a compare that its ID is unused, its claim and its record. One
// transaction is in flight at a time, so under load an order costs a
// fraction of one etcd write, and a place's next order runs its step while
// the previous one's commit is in flight (its reservation keeps the
// successor from planning with those units).
//
// A failed compare does not fail the batch silently: the Else branch reads
// every lock key, counter and order ID involved, and the committer answers
// the orders whose place was lost (lock.ErrLost) or whose ID was already
// used (a replay), refreshes its cache, and sends the rest again.

// commitPart is the units an order takes from one place, reserved under
// the lock key own of the place's queue q (and pinned there: a tenure is not
// released while the commit is pending).
//
// A direct part (direct.go) holds no lock: its place is a segment this
// process owns for lazy sales, fenced by its counter's ModRevision.
type commitPart struct {
	st  *placeState
	q   *lock.Queue
	own *lock.Ownership
	qty int64

	direct bool
	// lowWatermark is the SKU's, for a direct part: a lazy segment whose
	// units fall below it has its counter written, so that the rebalancer
	// (which reads counters) sees it run low.
	lowWatermark int64
	lockPfx      string // the segment's lock prefix, for a direct part
}

// reservePart reserves qty on st under own and pins own; it reports false
// (and holds nothing) when the place cannot give qty or own is gone.
func reservePart(q *lock.Queue, own *lock.Ownership, st *placeState, qty int64) (commitPart, bool) {
	if !q.Pin(own) {
		return commitPart{}, false
	}
	if !st.reserve(own, qty) {
		q.Unpin(own)
		return commitPart{}, false
	}
	return commitPart{st: st, q: q, own: own, qty: qty}, true
}

// cancel gives back a part that will not be committed.
func (p commitPart) cancel() {
	if p.direct {
		p.st.unreserveDirect(p.qty)
		return
	}
	p.st.unreserve(p.own, p.qty)
	p.q.Unpin(p.own)
}

// commitReq is one order handed to the committer.
type commitReq struct {
	req   *allocReq
	parts []commitPart
	// ctx is the caller's: a request refused by a compare (nothing
	// deducted) is sent again while it lasts, up to maxCommitAttempts.
	ctx      context.Context
	attempts int
	done     chan struct{} // closed once res is set
	res      placeResult
}

func (r *commitReq) resolve(res placeResult) {
	r.res = res
	close(r.done)
}

// wait returns the request's result, or ctx's cause when ctx ends first
// (the commit may then still land: a retry under the same order ID tells).
func (r *commitReq) wait(ctx context.Context) placeResult {
	select {
	case <-r.done:
		return r.res
	case <-ctx.Done():
		return failed(fmt.Errorf("%w (the order was handed to a commit that may still land: retry with the same order ID to learn its outcome)", context.Cause(ctx)))
	}
}

// submit hands parts of req to the committer; the caller waits on the
// returned request.
func (e *Engine) submit(ctx context.Context, req *allocReq, parts []commitPart) *commitReq {
	cr := &commitReq{req: req, parts: parts, ctx: ctx, done: make(chan struct{})}
	e.commits.Submit(cr)
	return cr
}

// finish gives back every part and resolves the request.
func (r *commitReq) finish(res placeResult) {
	for _, p := range r.parts {
		p.cancel()
	}
	r.resolve(res)
}

// commitOrders commits batch, or answers each request of it (the
// batcher's Commit).
func (e *Engine) commitOrders(bg context.Context, batch []*commitReq) {
	defer e.inflight.unmark(slices.Clone(batch))
	for len(batch) > 0 {
		batch = e.commitGroup(bg, batch)
	}
}

// commitGroup commits batch, or answers each request of it, except those
// it defers: when a transaction failed only because another process
// changed a buyer's counter meanwhile, the requests of that buyer are
// returned to be sent after the others, so that one buyer ordering hard
// from several processes at once does not make everyone's commit fail.
func (e *Engine) commitGroup(bg context.Context, batch []*commitReq) (deferred []*commitReq) {
	ctx, cancel := context.WithTimeout(bg, e.cfg.CommitTimeout)
	defer cancel()
	for len(batch) > 0 {
		if err := ctx.Err(); err != nil {
			// The commit timeout passed while planning (etcd slow or
			// unreachable): nothing of these was committed.
			for _, cr := range batch {
				cr.finish(failed(fmt.Errorf("commit did not get through within %v, nothing deducted: %w", e.cfg.CommitTimeout, err)))
			}
			return
		}
		var users []*batchUser
		if users, batch = e.planUsers(ctx, batch); len(batch) == 0 {
			return
		}
		places, order := e.planBatch(ctx, batch)
		// Answer what cannot be committed: places lost, or holding less
		// than their reservations (their cache was refreshed).
		keep := batch[:0:0]
		for _, cr := range batch {
			switch {
			case cr.touches(places, func(bp *batchPlace) bool { return bp.lost }):
				cr.finish(failed(lock.ErrLost))
			case cr.touches(places, func(bp *batchPlace) bool { return bp.err != nil }):
				cr.finish(failed(cr.placeErr(places)))
			case cr.touches(places, func(bp *batchPlace) bool { return bp.shortage }):
				cr.finish(failed(fmt.Errorf("stock changed under the lock after the business step; nothing deducted: %w", ErrContention)))
			case cr.ctx.Err() != nil:
				cr.finish(failed(fmt.Errorf("%w (its commit was refused by a compare and not sent again: nothing deducted)", context.Cause(cr.ctx))))
			case cr.attempts >= maxCommitAttempts:
				cr.finish(failed(fmt.Errorf("%d commits refused by compares, nothing deducted: %w", cr.attempts, ErrContention)))
			default:
				cr.attempts++
				keep = append(keep, cr)
			}
		}
		dropped := len(keep) != len(batch)
		batch = keep
		if len(batch) == 0 {
			return
		}
		if dropped || len(places) != countPlaces(batch) {
			// Some request was dropped (with its place, or alone after
			// too many attempts): what the plan takes from its places and
			// adds to its buyers included it. Plan again.
			continue
		}
		if absorbs := needAbsorb(order); len(absorbs) > 0 {
			// Inboxes are absorbed in a transaction of their own, so that
			// a release or a refill landing in one meanwhile fails only
			// that, never the batch; then the batch is planned again.
			e.absorb(ctx, absorbs)
			continue
		}

		var cmps []clientv3.Cmp
		var ops, diag []clientv3.Op
		for _, bp := range order {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(bp.own.Key()), "=", bp.own.Rev()),
				clientv3.Compare(clientv3.ModRevision(bp.st.key), "=", bp.modRev))
			ops = append(ops, clientv3.OpPut(bp.st.key, EncodeCounter(bp.value)))
			diag = append(diag, clientv3.OpGet(bp.own.Key(), clientv3.WithKeysOnly()))
		}
		resp, partsOf, err := e.sendOrders(ctx, batch, users, cmps, ops, diag)
		if err != nil {
			// The outcome is unknown: the orders' callers retry under the
			// same IDs to learn it, and the places are read again before
			// their next commit.
			for _, bp := range order {
				bp.st.invalidate()
			}
			e.settleUsers(users, 0, nil)
			for _, cr := range batch {
				cr.finish(failed(err))
			}
			return
		}
		if resp.Succeeded {
			rev := resp.Header.Revision
			for _, bp := range order {
				bp.st.settle(bp.own, bp.take, bp.n, bp.value, rev)
			}
			e.settleUsers(users, rev, nil)
			for i, cr := range batch {
				for _, p := range cr.parts {
					p.q.Unpin(p.own)
				}
				cr.resolve(served(e.allocation(cr.req, partsOf[i], rev)))
			}
			return
		}
		tail := resp.Responses[len(resp.Responses)-len(users):]
		e.settleUsers(users, 0, tail)
		var held []*batchPlace
		batch, held = e.diagnose(ctx, batch, order, resp.Responses)
		e.refreshPlaces(ctx, held)
		if hot := changedUsers(users, tail); len(hot) > 0 {
			var cool, later []*commitReq
			for _, cr := range batch {
				if hot[cr.req.userKey] {
					later = append(later, cr)
				} else {
					cool = append(cool, cr)
				}
			}
			if len(cool) > 0 && len(later) > 0 {
				batch, deferred = cool, append(deferred, later...)
			}
		}
	}
	return deferred
}
