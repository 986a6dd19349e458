package segments

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stockctl/stockctl/internal/lock"
)

// allocReq is one Allocate, AllocateFunc or Reserve call.
type allocReq struct {
	sku   *skuInfo
	order string
	qty   int64
	step  Step
	// ttl > 0 makes the order a reservation (Reserve).
	ttl   time.Duration
	buyer string
	// userKey is the buyer's counter, when the SKU has a per-user limit.
	userKey string
	// deadline is set by the committer when it builds the order record of
	// a reservation (only the committer's goroutine touches it).
	deadline time.Time
}

// Allocate takes qty units of sku for an order, and records the order.
//
// The request goes to segment Route(routeKey, N), or a random
// segment when routeKey is empty. If that segment cannot serve it (too
// little stock, or its lock stays busy for the home wait budget), it is
// served from the pool, then from the other segments in turn, and at last by
// gathering stock from several places in one transaction. It is refused with
// an *InsufficientStockError only when, at one etcd revision, the pool and
// all segments together held less than qty.
//
// Every deduction commits in an etcd transaction that checks the place's
// lock is still held and that creates the order record, so it is applied
// exactly once per order ID: calling Allocate again with the same order,
// SKU and qty returns the first result with Replayed set, deducting nothing;
// the same order ID with another SKU or qty is ErrConflict. After a timeout
// or a lost reply, retrying with the same order ID tells the true outcome.
//
// Concurrent allocations of this process waiting for the same place are
// committed together in one transaction (group commit). ctx bounds the
// wait; a request already handed to a group commit when ctx ends may still
// be committed (retry with the same order ID to learn the outcome).
func (e *Engine) Allocate(ctx context.Context, sku, order string, qty int64, routeKey string, opts ...OrderOption) (*Allocation, error) {
	return e.allocate(ctx, "allocate", sku, order, qty, routeKey, nil, 0, opts)
}

// AllocateFunc is Allocate with a business step: step runs while the locks
// of the place(s) the stock will come from are held and the stock is
// known to be there, and the deduction is committed only if step returns nil
// and the locks are still held. step's ctx is cancelled if a lock is lost.
//
// If a lock is lost after step returned nil, AllocateFunc returns an error
// wrapping lock.ErrLost and nothing is deducted: undo the step's effects, or
// retry with the same order ID (the step then runs again). A retry of an
// order that was applied returns the first result without running step;
// duplicates of one order ID sent at the same time may each run step, and
// exactly one of them deducts (the others return its result as a replay).
func (e *Engine) AllocateFunc(ctx context.Context, sku, order string, qty int64, routeKey string, step Step, opts ...OrderOption) (*Allocation, error) {
	if step == nil {
		return nil, fmt.Errorf("allocate %s order %q: %w: step is nil", sku, order, ErrInvalid)
	}
	return e.allocate(ctx, "allocate", sku, order, qty, routeKey, step, 0, opts)
}

func (e *Engine) allocate(ctx context.Context, verb, sku, order string, qty int64, routeKey string, step Step, ttl time.Duration, opts []OrderOption) (out *Allocation, outErr error) {
	defer func() { e.metrics.allocated(verb, sku, out, outErr) }()
	var o orderOpts
	for _, opt := range opts {
		opt(&o)
	}
	errs := []error{ValidateSKU(sku), ValidateOrderID(order),
		ValidateQty(qty), ValidateRouteKey(routeKey)}
	if o.buyer != "" {
		errs = append(errs, ValidateBuyer(o.buyer))
	}
	if verb == "reserve" {
		errs = append(errs, ValidateTTL(ttl))
	}
	if err := firstErr(errs...); err != nil {
		return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order, err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order, err)
	}
	req := &allocReq{sku: info, order: order, qty: qty, step: step, ttl: ttl, buyer: o.buyer}
	if info.perUserLimit > 0 {
		if o.buyer == "" {
			return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order, &InvalidError{Field: "buyer", Value: `""`,
				Reason: fmt.Sprintf("is required: the SKU has a per-user limit of %d", info.perUserLimit)})
		}
		if qty > info.perUserLimit {
			// No stock or counter needs reading to refuse this one.
			return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order,
				&LimitExceededError{SKU: sku, Buyer: o.buyer, Limit: info.perUserLimit, Want: qty})
		}
		req.userKey = e.keys.User(sku, o.buyer)
	}
	home := rand.IntN(info.segments)
	if routeKey != "" {
		home = Route(routeKey, info.segments)
	}
	a, err := e.serve(ctx, req, home)
	if err != nil {
		return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order, err)
	}
	return a, nil
}

// maxLostRetries bounds how often one allocation starts over after a lost
// lock or session (each start-over deducted nothing).
const maxLostRetries = 3

// serve sells req: from the segments this process holds (the seller), and
// when they cannot serve it, from the whole SKU as read at one revision.
func (e *Engine) serve(ctx context.Context, req *allocReq, home int) (*Allocation, error) {
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
	r := s.serve(ctx, req, home)
	for {
		switch {
		case r.kind == resServed:
			return r.alloc, nil
		case r.kind == resFailed:
			if !r.retryable() || req.step != nil || lostRetries >= maxLostRetries {
				return nil, r.err
			}
			lostRetries++
			if r = s.serve(ctx, req, home); r.kind != resShort {
				continue
			}
		}
		if err := context.Cause(ctx); err != nil {
			return nil, err
		}

		snap, err := e.snapshot(ctx, req.sku, req.order)
		if err != nil {
			return nil, err
		}
		if snap.orderKV != nil {
			return e.replay(ctx, req, snap.orderKV)
		}
		if snap.total() < req.qty {
			return nil, &InsufficientStockError{SKU: req.sku.name, Want: req.qty, Remaining: snap.total(), Revision: snap.rev}
		}
		r = placeResult{kind: resShort}
		for _, p := range snap.candidates(req.qty, home) {
			if p.IsPool() {
				// The pool is never held through a step: move its stock
				// into a segment this process holds and sell it there.
				if ok, err := s.pullFromPool(ctx, req.qty, home); err != nil {
					r = failed(err)
					break
				} else if ok {
					if r = s.serve(ctx, req, home); r.kind != resShort {
						break
					}
				}
				if req.step != nil {
					continue
				}
			}
			if r = e.tryPlace(ctx, req, p, e.cfg.FallbackWait); r.kind != resShort && r.kind != resBusy {
				break
			}
		}
		if r.kind == resShort || r.kind == resBusy {
			r = e.gather(ctx, req, snap)
		}
	}
}

// resultKind is what trying one place (or a gather) came to.
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

// tryPlace tries to serve req from one place, waiting up to wait for its lock.
func (e *Engine) tryPlace(ctx context.Context, req *allocReq, p Place, wait time.Duration) placeResult {
	hp, err := e.lockPlace(ctx, req.sku.name, p, wait)
	if err != nil {
		return lockFailure(err)
	}
	return e.commitHeld(ctx, []*heldPlace{hp}, req)
}

// gather serves req from several places at once: it locks places that had
// stock in snap in the global order (pool, then segments by index), so two
// gatherers can never wait for each other in a cycle, until the locked
// places hold qty together, and takes from them in one transaction. A place
// found empty is released at once: a gatherer only ever waits while holding
// places that contribute, and only lower ones.
func (e *Engine) gather(ctx context.Context, req *allocReq, snap *snapshot) placeResult {
	var held []*heldPlace
	defer func() {
		for _, hp := range held {
			hp.unlock()
		}
	}()
	var sum int64
	for _, p := range snap.withStock() {
		hp, err := e.lockPlace(ctx, req.sku.name, p, -1)
		if err != nil {
			return lockFailure(err)
		}
		if err := hp.load(ctx, true); err != nil {
			hp.unlock()
			return failed(err)
		}
		if hp.available() <= 0 {
			// Sold out since the snapshot: let it go now rather than
			// hold an empty place while waiting for the next one (which
			// would queue every other gatherer behind us).
			hp.unlock()
			continue
		}
		held = append(held, hp)
		if sum += hp.available(); sum >= req.qty {
			hs := held
			held = nil // commitHeld unlocks them
			return e.commitHeld(ctx, hs, req)
		}
	}
	return placeResult{kind: resShort}
}
