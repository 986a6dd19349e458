package coordinator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stockctl/stockctl/segments"
)

// Allocation is the outcome of an allocation: how much of a SKU an order
// took, and from where.
type Allocation struct {
	SKU   string
	Order string
	Qty   int64
	// Parts says where the stock came from; the quantities add up to Qty.
	Parts []segments.Part
	// Revision is the etcd revision at which the allocation was committed.
	Revision int64
	// Replayed is true when the order ID had already been applied before
	// this call: nothing was deducted now, and the fields describe the first
	// application.
	Replayed bool
	// Released is true when the order has since been released (only
	// possible on a replay).
	Released bool
	// State is "" for a plain allocation; for a reservation (Reserve) it is
	// segments.StateReserved when made, and on a replay whatever the
	// reservation has become since (confirmed, expired).
	State segments.OrderState
	// Deadline is when a reservation expires unless confirmed (zero for a
	// plain allocation).
	Deadline time.Time
	// Buyer is the buyer the order was placed for (WithBuyer), if any.
	Buyer string
}

// OrderOption adds to an order what not every caller needs.
type OrderOption func(*orderOpts)

type orderOpts struct {
	buyer string
}

// WithBuyer names the buyer an order is for. On a SKU with a per-user limit
// (SKUConfig.PerUserLimit) it is required, and the order is refused with
// ErrLimitExceeded when the buyer's units (confirmed and live reserved
// orders) would exceed the limit: the check and the deduction commit in one
// transaction. Elsewhere it is only recorded on the order. A buyer ID is 1
// to segments.MaxBuyerLen bytes of printable ASCII other than space and '/'.
// A retry of the order must name the same buyer. With AllocateFunc the
// limit is judged at the commit, after the step ran: a refused order's step
// must be undone like any step whose order failed.
func WithBuyer(buyer string) OrderOption {
	return func(o *orderOpts) { o.buyer = buyer }
}

// Step is a business step run by AllocateFunc while the stock it will take
// is locked: check the stock, create the order, charge the card... Its ctx
// is cancelled if a lock is lost meanwhile. Returning an error cancels the
// allocation: nothing is deducted and AllocateFunc returns the error.
type Step func(ctx context.Context) error

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
// The request goes to segment segments.Route(routeKey, N), or a random
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
func (c *Coordinator) Allocate(ctx context.Context, sku, order string, qty int64, routeKey string, opts ...OrderOption) (*Allocation, error) {
	return c.allocate(ctx, "allocate", sku, order, qty, routeKey, nil, 0, opts)
}

// AllocateFunc is Allocate with a business step: step runs while the locks
// of the place(s) the stock will come from are held and the stock is
// known to be there, and the deduction is committed only if step returns nil
// and the locks are still held. step's ctx is cancelled if a lock is lost.
//
// If a lock is lost after step returned nil, AllocateFunc returns an error
// wrapping ErrLockLost and nothing is deducted: undo the step's effects, or
// retry with the same order ID (the step then runs again). A retry of an
// order that was applied returns the first result without running step;
// duplicates of one order ID sent at the same time may each run step, and
// exactly one of them deducts (the others return its result as a replay).
func (c *Coordinator) AllocateFunc(ctx context.Context, sku, order string, qty int64, routeKey string, step Step, opts ...OrderOption) (*Allocation, error) {
	if step == nil {
		return nil, fmt.Errorf("allocate %s order %q: %w: step is nil", sku, order, ErrInvalidArgument)
	}
	return c.allocate(ctx, "allocate", sku, order, qty, routeKey, step, 0, opts)
}

func (c *Coordinator) allocate(ctx context.Context, verb, sku, order string, qty int64, routeKey string, step Step, ttl time.Duration, opts []OrderOption) (out *Allocation, outErr error) {
	defer func() { c.metrics.allocated(verb, sku, out, outErr) }()
	var o orderOpts
	for _, opt := range opts {
		opt(&o)
	}
	errs := []error{segments.ValidateSKU(sku), segments.ValidateOrderID(order),
		segments.ValidateQty(qty), segments.ValidateRouteKey(routeKey)}
	if o.buyer != "" {
		errs = append(errs, segments.ValidateBuyer(o.buyer))
	}
	if verb == "reserve" {
		errs = append(errs, segments.ValidateTTL(ttl))
	}
	if err := firstErr(errs...); err != nil {
		return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order, err)
	}
	info, err := c.sku(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order, err)
	}
	req := &allocReq{sku: info, order: order, qty: qty, step: step, ttl: ttl, buyer: o.buyer}
	if info.perUserLimit > 0 {
		if o.buyer == "" {
			return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order, &segments.InvalidError{Field: "buyer", Value: `""`,
				Reason: fmt.Sprintf("is required: the SKU has a per-user limit of %d", info.perUserLimit)})
		}
		if qty > info.perUserLimit {
			// No stock or counter needs reading to refuse this one.
			return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order,
				&LimitExceededError{SKU: sku, Buyer: o.buyer, Limit: info.perUserLimit, Want: qty})
		}
		req.userKey = c.keys.User(sku, o.buyer)
	}
	home := rand.IntN(info.segments)
	if routeKey != "" {
		home = segments.Route(routeKey, info.segments)
	}
	a, err := c.serve(ctx, req, home)
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
func (c *Coordinator) serve(ctx context.Context, req *allocReq, home int) (*Allocation, error) {
	if req.step != nil {
		// A retry of an applied order must not run the step again: look
		// before taking any slot. A duplicate racing the first application
		// may still run the step; the commit's order-ID compare lets only
		// one deduct.
		idx, err := c.kv.Get(ctx, c.keys.OrderID(req.order))
		if err != nil {
			return nil, err
		}
		if len(idx.Kvs) > 0 {
			return c.replay(ctx, req, idx.Kvs[0])
		}
	}
	s, err := c.seller(req.sku)
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

		snap, err := c.snapshot(ctx, req.sku, req.order)
		if err != nil {
			return nil, err
		}
		if snap.orderKV != nil {
			return c.replay(ctx, req, snap.orderKV)
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
			if r = c.tryPlace(ctx, req, p, c.opts.fallbackWait); r.kind != resShort && r.kind != resBusy {
				break
			}
		}
		if r.kind == resShort || r.kind == resBusy {
			r = c.gather(ctx, req, snap)
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
	return errors.Is(r.err, ErrLockLost) || errors.Is(r.err, ErrSessionLost)
}

// lockFailure turns a failed lock wait into a result.
func lockFailure(err error) placeResult {
	if errors.Is(err, ErrLocked) {
		return placeResult{kind: resBusy}
	}
	return failed(err)
}

// tryPlace tries to serve req from one place, waiting up to wait for its lock.
func (c *Coordinator) tryPlace(ctx context.Context, req *allocReq, p segments.Place, wait time.Duration) placeResult {
	hp, err := c.lockPlace(ctx, req.sku.name, p, wait, nil)
	if err != nil {
		return lockFailure(err)
	}
	return c.commitHeld(ctx, []*heldPlace{hp}, req)
}

// gather serves req from several places at once: it locks places that had
// stock in snap in the global order (pool, then segments by index), so two
// gatherers can never wait for each other in a cycle, until the locked
// places hold qty together, and takes from them in one transaction. A place
// found empty is released at once: a gatherer only ever waits while holding
// places that contribute, and only lower ones.
func (c *Coordinator) gather(ctx context.Context, req *allocReq, snap *snapshot) placeResult {
	var held []*heldPlace
	defer func() {
		for _, hp := range held {
			hp.unlock()
		}
	}()
	var sum int64
	for _, p := range snap.withStock() {
		hp, err := c.lockPlace(ctx, req.sku.name, p, -1, nil)
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
			return c.commitHeld(ctx, hs, req)
		}
	}
	return placeResult{kind: resShort}
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
