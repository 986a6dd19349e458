package cli

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/segments"
)

// demoStockWait is how often a checkout buyer told "sold out" while
// reservations are still live looks again: their expiry may give stock back.
const demoStockWait = 50 * time.Millisecond

// demoMaxIdentities bounds how many times one order switches to a fresh
// buyer identity after a per-user-limit refusal.
const demoMaxIdentities = 3

// demoCheckoutBuy places an order as a shop does: Reserve, the payment
// (the step, outside any lock), Confirm. Some calls first leave a cart
// unpaid: a reservation under the order ID + "-cart" that is never
// confirmed and expires. The choice is a hash of the order ID, so that a
// retry decides the same. Each sale buyer acts as a series of users: when
// one reaches the per-user limit it is refused (ErrLimitExceeded, nothing
// taken), and the next order comes from a new user. A refusal for lack of
// stock is passed on only when no reservation is live (none can expire and
// give stock back): until then the buyer waits, as a shopper refreshing the
// page would.
func demoCheckoutBuy(cs []*coordinator.Coordinator, d demoConfig, t *demoTally) sale.Buy {
	gens := make([]int64, d.Buyers) // buyer b's current identity; only b's goroutine touches gens[b]
	// Abandon a cart in a calls of every 100 so that abandoned carts are
	// AbandonPercent of all reservations: a/(100+a) = p/100.
	a := int64(0)
	if p := int64(d.AbandonPercent); p > 0 {
		a = (100*p + (100-p)/2) / (100 - p)
	}
	pay := func(ctx context.Context) error {
		if d.step > 0 && !background.Sleep(ctx, d.step) {
			return context.Cause(ctx)
		}
		return nil
	}
	return func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error) {
		c := cs[buyer%len(cs)]
		user := func() string { return fmt.Sprintf("user-%d-%d", buyer, gens[buyer]) }
		reserve := func(id string, qty int64) (*coordinator.Allocation, error) {
			for switched := 0; ; {
				r, err := c.Reserve(ctx, d.SKU, id, qty, routeKey, d.reserveTTL, coordinator.WithBuyer(user()))
				if errors.Is(err, coordinator.ErrLimitExceeded) && switched < demoMaxIdentities {
					t.limitRefusal()
					gens[buyer]++ // nothing was taken: this order is the next user's
					switched++
					continue
				}
				if errors.Is(err, coordinator.ErrInsufficientStock) {
					if live, serr := c.Status(ctx, d.SKU); serr == nil && live.Reservations > 0 {
						if !background.Sleep(ctx, demoStockWait) {
							return nil, fmt.Errorf("waiting for live reservations to expire: %w", context.Cause(ctx))
						}
						continue
					}
				}
				return r, err
			}
		}
		if h := fnv.New32a(); a > 0 {
			h.Write([]byte(order))
			if int64(h.Sum32()%100) < a {
				cart := order + "-cart"
				if r, err := reserve(cart, qty); err == nil && !r.Replayed {
					t.abandoned(r.Qty)
				}
				// A cart that could not be placed is simply not left.
			}
		}
		r, err := reserve(order, qty)
		if err != nil {
			return nil, err
		}
		switch r.State {
		case segments.StateExpired:
			return nil, &coordinator.ExpiredError{SKU: r.SKU, Order: r.Order, Deadline: r.Deadline}
		case segments.StateConfirmed:
			return r, nil // a retry of an order confirmed before its reply was lost
		}
		if err := pay(ctx); err != nil {
			return nil, err
		}
		if _, err := c.Confirm(ctx, d.SKU, order); err != nil {
			return nil, err
		}
		t.order(r)
		return r, nil
	}
}

func (t *demoTally) expire(x segments.Expiry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expired++
	t.expiredUnits += x.Qty
	t.expiryDelays = append(t.expiryDelays, x.At.Sub(x.Deadline))
}

func (t *demoTally) abandoned(qty int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.carts++
	t.cartUnits += qty
}

func (t *demoTally) limitRefusal() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.limitRefusals++
}

// buyerUnits reads every buyer's counter of sku: the units each holds.
func buyerUnits(ctx context.Context, c *coordinator.Coordinator, sku string) (map[string]int64, error) {
	resp, err := engines.Of(c).KV.Get(ctx, engines.Of(c).Keys.Users(sku), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		b, err := engines.Of(c).Keys.ParseUser(sku, string(kv.Key))
		if err != nil {
			return nil, err
		}
		if out[b], err = segments.DecodeCounter(string(kv.Key), kv.Value); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkoutView is the checkout mode's part of the demo report.
type checkoutView struct {
	// Abandoned carts: reservations never paid, and the units they held.
	Abandoned      int64 `json:"abandoned"`
	AbandonedUnits int64 `json:"abandonedUnits"`
	// Expired: reservations the rebalancer expired, their units returned
	// (and sold again when the sale sold out), and the delay from their
	// deadline to the expiry's commit.
	Expired       int64       `json:"expired"`
	ExpiredUnits  int64       `json:"expiredUnits"`
	ExpiryDelayMs latencyView `json:"expiryDelayMs"`
	// LimitRefusals counts orders refused by the per-user limit;
	// Buyers how many buyers hold units, MaxPerBuyer the most one holds.
	PerUserLimit  int64 `json:"perUserLimit"`
	LimitRefusals int64 `json:"limitRefusals"`
	Buyers        int64 `json:"buyers"`
	MaxPerBuyer   int64 `json:"maxPerBuyer"`
}

// addCheckout adds the checkout figures and their checks: every abandoned
// cart expired, no buyer holds more than the limit.
func (r *demoReport) addCheckout(d demoConfig, t *demoTally, held map[string]int64) {
	t.mu.Lock()
	v := &checkoutView{Abandoned: t.carts, AbandonedUnits: t.cartUnits, Expired: t.expired, ExpiredUnits: t.expiredUnits,
		PerUserLimit: d.PerUserLimit, LimitRefusals: t.limitRefusals, Buyers: int64(len(held))}
	delays := slices.Clone(t.expiryDelays)
	t.mu.Unlock()
	slices.Sort(delays)
	if n := len(delays); n > 0 {
		at := func(p int) time.Duration { return delays[min(n-1, n*p/100)] }
		v.ExpiryDelayMs = latencyView{P50: ms(at(50)), P90: ms(at(90)), P99: ms(at(99)), Max: ms(delays[n-1])}
	}
	for _, u := range held {
		v.MaxPerBuyer = max(v.MaxPerBuyer, u)
	}
	r.Checkout = v
	if v.Expired != v.Abandoned || v.ExpiredUnits != v.AbandonedUnits {
		r.Failures = append(r.Failures, fmt.Sprintf("%d carts (%d units) were abandoned, but %d reservations (%d units) expired",
			v.Abandoned, v.AbandonedUnits, v.Expired, v.ExpiredUnits))
	}
	if d.PerUserLimit > 0 && v.MaxPerBuyer > d.PerUserLimit {
		r.Failures = append(r.Failures, fmt.Sprintf("a buyer holds %d units, over the per-user limit %d", v.MaxPerBuyer, d.PerUserLimit))
	}
	r.OK = len(r.Failures) == 0
}

func (v *checkoutView) rows(t *table) {
	t.add("ABANDONED", fmt.Sprintf("%d carts never paid (%d units)", v.Abandoned, v.AbandonedUnits))
	t.add("EXPIRED", fmt.Sprintf("%d reservations (%d units) returned by the rebalancer, p50 %s p99 %s max %s after their deadline, and sold again",
		v.Expired, v.ExpiredUnits, msText(v.ExpiryDelayMs.P50), msText(v.ExpiryDelayMs.P99), msText(v.ExpiryDelayMs.Max)))
	t.add("PER USER", fmt.Sprintf("at most %d units of a limit of %d (%d users; %d orders refused by the limit)",
		v.MaxPerBuyer, v.PerUserLimit, v.Buyers, v.LimitRefusals))
}
