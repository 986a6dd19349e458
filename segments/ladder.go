package segments

import (
	"context"
	"errors"

	"github.com/stockctl/stockctl/internal/lock"
)

// The ladder. An order looks for its stock in this order, cheapest first,
// and stops at the first rung that serves it:
//
//  1. held:    a segment this process holds (a tenure): no lock round trip,
//     its units reserved in the segment's cache (a step order takes a free
//     slot there, slots.go; a plain order needs none, local.go).
//  2. inboxes: the held segments' inboxes read now; refills and releases
//     land there (pull.go).
//  3. pull:    stock moved from the pool into a held segment's inbox, in a
//     short move under the pool's lock (pull.go).
//  4. grow:    one more segment, within the fair share (grow.go).
//  5. whole:   the whole SKU read at one revision (snapshot.go): a replay if
//     the order ID was used meanwhile, a refusal if the SKU holds too little
//     in all, else the places that hold the quantity alone.
//  6. places:  each of those in turn (gather.go): the pool by a pull into a
//     held segment (rung 3 again), and for an order without a step under
//     the pool's own lock; a segment under its lock, waited for at most
//     FallbackWait.
//  7. gather:  several places at once, locked in the global order and taken
//     from in one transaction (gather.go).
//
// Rungs 2 to 4 send the order back to rung 1 when they found stock (only
// the oldest waiting step order climbs them, the others wait for it); rung 7
// finding too little sends it back to rung 5, the stock having moved. An
// order whose lock was lost (nothing deducted) starts again at rung 1, at
// most maxLostRetries times, unless its step already ran.

// maxLostRetries bounds how often one allocation starts over after a lost
// lock or session (each start-over deducted nothing).
const maxLostRetries = 3

// sell is the one path of an order: down the ladder until a rung serves,
// refuses or fails it.
func (e *Engine) sell(ctx context.Context, req *allocReq, home int) (*Allocation, error) {
	if req.step != nil {
		// A retry of an applied order must not run the step again: look
		// before taking any slot. A duplicate racing the first application
		// may still run the step; the commit's order-ID compare lets only
		// one deduct.
		idx, err := e.kv.Get(ctx, e.keys.OrderID(req.order))
		if err != nil {
			return nil, err
		}
		if len(idx.Kvs) > 0 {
			return e.replay(ctx, req, idx.Kvs[0])
		}
	}
	s, err := e.seller(req.sku)
	if err != nil {
		return nil, err
	}
	lostRetries := 0
	r := s.serve(ctx, req, home) // rungs 1 to 4
	for {
		switch r.kind {
		case resServed:
			return r.alloc, nil
		case resFailed:
			if !r.retryable() || req.step != nil || lostRetries >= maxLostRetries {
				return nil, r.err
			}
			lostRetries++
			r = s.serve(ctx, req, home)
		default: // resShort, resBusy
			r = e.whole(ctx, s, req, home) // rungs 5 to 7
		}
	}
}

// whole is rungs 5 to 7: the whole SKU at one revision, then the places
// that hold the quantity alone, then a gather.
func (e *Engine) whole(ctx context.Context, s *seller, req *allocReq, home int) placeResult {
	if err := context.Cause(ctx); err != nil {
		return failed(err)
	}
	snap, err := e.snapshot(ctx, req.sku, req.order)
	if err != nil {
		return failed(err)
	}
	if snap.orderKV != nil {
		return result(e.replay(ctx, req, snap.orderKV))
	}
	if snap.total() < req.qty {
		return failed(&InsufficientStockError{SKU: req.sku.name, Want: req.qty, Remaining: snap.total(), Revision: snap.rev})
	}
	for _, p := range snap.candidates(req.qty, home) {
		if p.IsPool() {
			// The pool is moved into a segment this process holds and sold
			// there; a step order does not wait for the pool's lock here.
			ok, err := s.pullFromPool(ctx, req.qty, home)
			if err != nil {
				return failed(err)
			}
			if ok {
				if r := s.serve(ctx, req, home); r.kind != resShort {
					return r
				}
			}
			if req.step != nil {
				continue
			}
		}
		if r := e.tryPlace(ctx, req, p, e.cfg.FallbackWait); r.kind != resShort && r.kind != resBusy {
			return r
		}
	}
	return e.gather(ctx, req, snap)
}

// rung names the dry rungs (2 to 4) for dryRungs.
type rung int

const (
	rungInboxes rung = iota + 2
	rungPull
	rungGrow
)

// rungActions is what the dry rungs do; the seller does it, tests fake it.
type rungActions interface {
	refreshInboxes(ctx context.Context, qty int64) (bool, error)
	pullFromPool(ctx context.Context, qty int64, home int) (bool, error)
	grow(ctx context.Context, home int) bool
}

// dryRungs are rungs 2 to 4, each taken once per order, in turn, when no
// held segment can give the order's quantity. The pool comes before other
// segments so that a process stays within its share while the pool lasts.
type dryRungs struct{ taken int }

// climb takes the next dry rung. again means it found stock (back to rung
// 1); otherwise the result is the order's failure, or, once all three found
// nothing, resShort (on to the whole SKU).
func (d *dryRungs) climb(ctx context.Context, a rungActions, qty int64, home int) (r placeResult, again bool) {
	for d.taken < 3 {
		next := rungInboxes + rung(d.taken)
		d.taken++
		var ok bool
		var err error
		switch next {
		case rungInboxes:
			ok, err = a.refreshInboxes(ctx, qty)
		case rungPull:
			ok, err = a.pullFromPool(ctx, qty, home)
		case rungGrow:
			ok = a.grow(ctx, home)
		}
		if err != nil {
			return failed(err), false
		}
		if ok {
			return placeResult{}, true
		}
	}
	return placeResult{kind: resShort}, false
}

// resultKind is what trying one rung or place came to.
type resultKind int

const (
	resShort  resultKind = iota // the place(s) held too little: try elsewhere
	resBusy                     // the lock stayed busy for the wait budget
	resServed                   // committed (or replayed): done
	resFailed                   // err says why; some errors allow starting over
)

type placeResult struct {
	kind  resultKind
	alloc *Allocation
	err   error
}

func served(a *Allocation) placeResult { return placeResult{kind: resServed, alloc: a} }
func failed(err error) placeResult     { return placeResult{kind: resFailed, err: err} }

func result(a *Allocation, err error) placeResult {
	if err != nil {
		return failed(err)
	}
	return served(a)
}

// retryable reports whether the failure deducted nothing and a new attempt
// (on a new session) may succeed.
func (r placeResult) retryable() bool {
	return errors.Is(r.err, lock.ErrLost) || errors.Is(r.err, lock.ErrSessionLost)
}

// lockFailure turns a failed lock wait into a result.
func lockFailure(err error) placeResult {
	if errors.Is(err, lock.ErrLocked) {
		return placeResult{kind: resBusy}
	}
	return failed(err)
}
