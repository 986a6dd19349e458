package sale

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/background"
)

// buyerResult is what one buyer saw; buyers keep it to themselves until
// the end, so that recording a latency takes no lock.
type buyerResult struct {
	orders    int64
	soldOut   bool
	latencies []time.Duration
}

// outcome is what became of one order.
type outcome int

const (
	served     outcome = iota
	refused            // insufficient stock
	unresolved         // every attempt failed, or the run was cut off
)

// buyer places orders until it is told the SKU is sold out or the run stops.
// Each iteration places one new order ID, so the loop is bounded by the
// stock (every served order takes at least one unit), by MaxOrders and by
// the run's stop.
func (r *run) buyer(ctx context.Context, id int) buyerResult {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(id)))
	routeKey := r.cfg.RouteKey(id)
	var res buyerResult
	var seq int64
	// next hands out the buyer's next order ID, or false when the run must
	// not place another order.
	next := func() (string, bool) {
		if r.stopped() || ctx.Err() != nil {
			return "", false
		}
		if r.cfg.MaxOrders > 0 && r.placed.Add(1) > r.cfg.MaxOrders {
			r.stop(StopMaxOrders)
			return "", false
		}
		seq++
		return orderID(r.cfg.OrderPrefix, id, seq), true
	}
	for {
		order, ok := next()
		if !ok {
			return res
		}
		qty := r.cfg.MinQty + rng.Int64N(r.cfg.MaxQty-r.cfg.MinQty+1)
		out := r.place(ctx, id, order, qty, routeKey, &res)
		if out == refused && qty > 1 {
			// The last units of a sale are spread thin: try for one.
			if order, ok = next(); !ok {
				return res
			}
			out = r.place(ctx, id, order, 1, routeKey, &res)
		}
		if out == refused {
			// Refused one unit: at one revision the whole SKU held none.
			res.soldOut = true
			return res
		}
	}
}

// place tries one order until it is served, refused, or out of attempts.
// attemptTimeout is the cause of an attempt cut off by its timeout, its
// message formatted only when read (formatting it for every attempt was
// 2 % of a sale's CPU in the bench's profile).
type attemptTimeout struct {
	order   string
	attempt int
	limit   time.Duration
}

func (e *attemptTimeout) Error() string {
	return fmt.Sprintf("order %q: attempt %d took longer than %v", e.order, e.attempt, e.limit)
}

func (r *run) place(ctx context.Context, buyer int, order string, qty int64, routeKey string, res *buyerResult) outcome {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeoutCause(ctx, r.cfg.AttemptTimeout, &attemptTimeout{order, attempt, r.cfg.AttemptTimeout})
		a, err := r.cfg.Buy(actx, buyer, order, qty, routeKey)
		if cause := context.Cause(actx); err != nil && ctx.Err() == nil && cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		cancel()
		switch {
		case err == nil && a == nil:
			err = fmt.Errorf("order %q: Buy returned neither an allocation nor an error", order)
		case err == nil && a.Replayed && attempt == 1:
			// Only a retry may find its own earlier commit; on a first
			// attempt the ID was used before this run, and the units are
			// not this run's.
			err = fmt.Errorf("order %q was already used before this run (set a fresh OrderPrefix)", order)
		case err == nil && a.Qty != qty:
			err = fmt.Errorf("order %q: asked for %d units, the allocation says %d", order, qty, a.Qty)
		}
		if err == nil {
			if a.Replayed {
				r.replayed.Add(1)
			}
			r.orders.Add(1)
			r.units.Add(qty)
			res.orders++
			res.latencies = append(res.latencies, time.Since(start))
			r.noteServed()
			return served
		}
		if errors.Is(err, coordinator.ErrInsufficientStock) {
			r.refusals.Add(1)
			return refused
		}
		if ctx.Err() != nil {
			// Cut off by the run's end: not the order's fault, but its
			// outcome is unknown.
			r.unresolved.Add(1)
			return unresolved
		}
		r.noteError(err)
		if attempt >= r.cfg.MaxAttempts || !background.Sleep(ctx, retryBackoff<<(attempt-1)) {
			r.unresolved.Add(1)
			return unresolved
		}
	}
}

// noteServed records the time of the latest served order.
func (r *run) noteServed() {
	now := int64(time.Since(r.start))
	for {
		last := r.lastServed.Load()
		if now <= last || r.lastServed.CompareAndSwap(last, now) {
			return
		}
	}
}
