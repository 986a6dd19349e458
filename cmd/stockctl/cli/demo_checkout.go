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

// demoCartSuffix ends the order ID of a cart left unpaid.
const demoCartSuffix = "-cart"

// demoMaxLate bounds how often one order is placed again after its
// reservation expired before its payment arrived.
const demoMaxLate = 10

// demoCheckoutBuy places an order as a shop does: Reserve, the payment
// (the step, outside any lock), Confirm. Some calls first leave a cart
// unpaid: a reservation under the order ID + "-cart" that is never
// confirmed and expires. The choice is a hash of the order ID, so that a
// retry decides the same. A reservation whose payment comes after its
// deadline (a slow machine, a slow step) expires, as a shop's would: the
// buyer places the order again, under the order ID + "-late1", "-late2"...
// (the same IDs on a retry, so that a retry finds what the first attempt
// did). Each sale buyer acts as a series of users: when
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
					// Sold out for now: units held by live reservations may
					// come back. NextExpiry is one key's read; Status here
					// (every refused buyer reading the whole SKU, 40 at
					// once) loaded etcd enough to delay the sweep's expiries
					// (p99 0.36-0.53 s against 0.07-0.14 s, stop 47).
					if _, live, serr := c.NextExpiry(ctx, d.SKU); serr == nil && live {
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
				// A cart that could not be placed is simply not left; the
				// books count the carts that were.
				_, _ = reserve(order+demoCartSuffix, qty)
			}
		}
		for late := 0; ; late++ {
			id := order
			if late > 0 {
				id = fmt.Sprintf("%s-late%d", order, late)
			}
			r, err := reserve(id, qty)
			if err != nil {
				return nil, err
			}
			switch r.State {
			case segments.StateExpired:
				if late < demoMaxLate {
					continue // a retry finds the first attempt's expired reservation
				}
				return nil, fmt.Errorf("order %q: its reservation expired before its payment %d times", order, late+1)
			case segments.StateConfirmed:
				return r, nil // a retry of an order confirmed before its reply was lost
			}
			if err := pay(ctx); err != nil {
				return nil, err
			}
			_, err = c.Confirm(ctx, d.SKU, id)
			if errors.Is(err, coordinator.ErrExpired) && late < demoMaxLate {
				continue // paid too late: the units went back; the buyer orders again
			}
			if err != nil {
				return nil, err
			}
			t.order(r)
			return r, nil
		}
	}
}

func (t *demoTally) expire(x segments.Expiry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expiryDelays = append(t.expiryDelays, x.At.Sub(x.Deadline))
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

// checkoutView is the checkout mode's part of the demo report. Every
// figure but the delays is read from the order records after the sale.
type checkoutView struct {
	// Abandoned carts: reservations never paid, and the units they held.
	Abandoned      int64 `json:"abandoned"`
	AbandonedUnits int64 `json:"abandonedUnits"`
	// Expired: reservations that expired, their units returned (and sold
	// again when the sale sold out): the abandoned carts, and Late, orders
	// whose payment came after their deadline (each placed again).
	Expired      int64 `json:"expired"`
	ExpiredUnits int64 `json:"expiredUnits"`
	Late         int64 `json:"late"`
	// ExpiryDelayMs is the delay from a deadline to its expiry's commit,
	// for the expiries this demo's rebalancer made (none when another
	// process's rebalancer leads).
	ExpiryDelayMs latencyView `json:"expiryDelayMs"`
	// LimitRefusals counts orders refused by the per-user limit;
	// Buyers how many buyers hold units, MaxPerBuyer the most one holds.
	PerUserLimit  int64 `json:"perUserLimit"`
	LimitRefusals int64 `json:"limitRefusals"`
	Buyers        int64 `json:"buyers"`
	MaxPerBuyer   int64 `json:"maxPerBuyer"`
}

// addCheckout adds the checkout figures and their checks: every abandoned
// cart expired, no reservation is left live, the audit counts the same
// expiries, no buyer holds more than the limit.
func (r *demoReport) addCheckout(d demoConfig, t *demoTally, b *checkoutBooks, held map[string]int64) {
	t.mu.Lock()
	v := &checkoutView{Abandoned: b.carts, AbandonedUnits: b.cartUnits, Expired: b.expired, ExpiredUnits: b.expiredUnits,
		Late: b.late, PerUserLimit: d.PerUserLimit, LimitRefusals: t.limitRefusals, Buyers: int64(len(held))}
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
	if b.cartsExpired != b.carts {
		r.Failures = append(r.Failures, fmt.Sprintf("%d carts were abandoned, but only %d of them expired", b.carts, b.cartsExpired))
	}
	if b.live != 0 && r.SoldOut {
		r.Failures = append(r.Failures, fmt.Sprintf("the sale sold out with %d reservations still live", b.live))
	}
	if v.Expired != r.Audit.ExpiredOrders {
		r.Failures = append(r.Failures, fmt.Sprintf("the order records count %d expired reservations, the audit %d", v.Expired, r.Audit.ExpiredOrders))
	}
	if d.PerUserLimit > 0 && v.MaxPerBuyer > d.PerUserLimit {
		r.Failures = append(r.Failures, fmt.Sprintf("a buyer holds %d units, over the per-user limit %d", v.MaxPerBuyer, d.PerUserLimit))
	}
	r.OK = len(r.Failures) == 0
}

func (v *checkoutView) rows(t *table) {
	t.add("ABANDONED", fmt.Sprintf("%d carts never paid (%d units)", v.Abandoned, v.AbandonedUnits))
	expired := fmt.Sprintf("%d reservations (%d units) expired and sold again", v.Expired, v.ExpiredUnits)
	if v.Late > 0 {
		expired += fmt.Sprintf(" (%d of them orders paid after their deadline, placed again)", v.Late)
	}
	if v.ExpiryDelayMs.Max > 0 {
		expired += fmt.Sprintf("; p50 %s p99 %s max %s after their deadline", msText(v.ExpiryDelayMs.P50), msText(v.ExpiryDelayMs.P99), msText(v.ExpiryDelayMs.Max))
	}
	t.add("EXPIRED", expired)
	t.add("PER USER", fmt.Sprintf("at most %d units of a limit of %d (%d users; %d orders refused by the limit)",
		v.MaxPerBuyer, v.PerUserLimit, v.Buyers, v.LimitRefusals))
}
