package segments

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
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
	// routed: the order named a route key, so its home segment is the
	// one it prefers (direct orders too, direct.go).
	routed bool
	home   int
	// userKey is the buyer's counter, when the SKU has a per-user limit.
	userKey string
	// deadline is set by the committer when it builds the order record of
	// a reservation (only the committer's goroutine touches it).
	deadline time.Time
	// across is the whole order's SKUs over every cluster (WithAcross).
	across []string
}

// Allocate takes qty units of sku for an order, and records it: the
// ladder (ladder.go) from the segments this process holds down to the
// whole SKU; refused only when the whole SKU held too little at one
// revision. coordinator.Coordinator.Allocate documents the contract.
func (e *Engine) Allocate(ctx context.Context, sku, order string, qty int64, routeKey string, opts ...OrderOption) (*Allocation, error) {
	return e.allocate(ctx, "allocate", sku, order, qty, routeKey, nil, 0, opts)
}

// AllocateFunc is Allocate with a business step run while the stock's
// place is held (coordinator.Coordinator.AllocateFunc documents it).
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
		return nil, orderErr(verb, sku, order, err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return nil, orderErr(verb, sku, order, err)
	}
	req := &allocReq{sku: info, order: order, qty: qty, step: step, ttl: ttl, buyer: o.buyer}
	if info.perUserLimit > 0 {
		if o.buyer == "" {
			return nil, orderErr(verb, sku, order, &InvalidError{Field: "buyer", Value: `""`,
				Reason: fmt.Sprintf("is required: the SKU has a per-user limit of %d", info.perUserLimit)})
		}
		if qty > info.perUserLimit {
			// No stock or counter needs reading to refuse this one; only
			// the order's record, which may say it was applied before
			// (with another qty: ErrConflict, which says more than the
			// limit does).
			resp, err := e.kv.Get(ctx, e.keys.Order(sku, order))
			if err != nil {
				return nil, orderErr(verb, sku, order, fmt.Errorf("read order: %w", err))
			}
			if len(resp.Kvs) > 0 {
				a, err := e.replay(ctx, req, resp.Kvs[0])
				if err != nil {
					return nil, orderErr(verb, sku, order, err)
				}
				return a, nil
			}
			return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order,
				&LimitExceededError{SKU: sku, Buyer: o.buyer, Limit: info.perUserLimit, Want: qty, Revision: resp.Header.Revision})
		}
		req.userKey = e.keys.User(sku, o.buyer)
	}
	if err := e.guardNewOrder(ctx, sku, order); err != nil {
		return nil, orderErr(verb, sku, order, err)
	}
	home := rand.IntN(info.segments)
	if routeKey != "" {
		home, req.routed = Route(routeKey, info.segments), true
	}
	req.home = home
	a, err := e.sell(ctx, req, home)
	if err != nil {
		return nil, orderErr(verb, sku, order, err)
	}
	return a, nil
}

// orderError is an order's error with the call, SKU and order it concerns,
// as "allocate iphone order "o-1": <err>". The text is made when asked for:
// in a sold-out storm most orders end in a refusal, and formatting each one
// would be a good part of what a refusal costs.
type orderError struct {
	verb, sku, order string
	err              error
}

func orderErr(verb, sku, order string, err error) error {
	return &orderError{verb: verb, sku: sku, order: order, err: err}
}

func (e *orderError) Error() string {
	return fmt.Sprintf("%s %s order %q: %v", e.verb, e.sku, e.order, e.err)
}

func (e *orderError) Unwrap() error { return e.err }
