package rebalance

import (
	"context"
	"errors"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

// DefaultExpiryPoll is how often the leader looks for reservations that
// became due without its knowing (made after its last look). Between looks
// it sleeps until the earliest deadline it knows of, so a reservation whose
// TTL is longer than this is expired as soon as it is due; one with a
// shorter TTL can wait up to this long. Each look costs two reads per SKU
// that has live reservations (a watch of the reservation index keys says
// which), none for the others.
const DefaultExpiryPoll = 250 * time.Millisecond

// expiryBatch bounds one ExpireDue call; a larger backlog takes several.
const expiryBatch = 256

// sweepExpired expires every due reservation of every SKU, fenced by the
// leadership, until ctx ends (with the term) or leadership is lost. It runs
// beside the stock watch: expiry returns units lock-free to segments'
// inboxes (the pool's lock only for units that came from the pool), so it
// never waits behind the refills.
func (r *Rebalancer) sweepExpired(ctx context.Context, l *leadership) error {
	res := &reserved{}
	fctx, stop := context.WithCancel(ctx)
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		r.follow(fctx, res)
	}()
	defer func() { stop(); <-followed }()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		next := time.Now().Add(r.cfg.ExpiryPoll)
		skus, known := res.skus()
		var err error
		if !known {
			// Until the index keys were read: every SKU.
			if skus, err = r.c.stock.SKUs(ctx); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				r.log.Warn("expiry sweep cannot list SKUs", "err", err)
			}
		}
		for _, sku := range skus {
			if _, err := r.expireSKU(ctx, l, sku); err != nil {
				if isFatal(err) || ctx.Err() != nil {
					return err
				}
				r.log.Warn("expiry sweep failed", "sku", sku, "err", err)
				continue
			}
			if d, ok, err := r.c.stock.NextDeadline(ctx, sku); err == nil && ok && d.Before(next) {
				next = d
			}
		}
		timer.Reset(max(0, time.Until(next)))
	}
}

// expireSKU expires sku's due reservations, batch after batch.
func (r *Rebalancer) expireSKU(ctx context.Context, l *leadership, sku string) ([]segments.Expiry, error) {
	var all []segments.Expiry
	for {
		xs, err := r.c.stock.ExpireDue(ctx, sku, time.Now(), expiryBatch, l.fence)
		for _, x := range xs {
			if r.cfg.OnExpire != nil {
				r.cfg.OnExpire(x)
			}
		}
		all = append(all, xs...)
		r.mu.Lock()
		r.totalExpired += len(xs)
		r.mu.Unlock()
		if err != nil {
			if errors.Is(err, coordinator.ErrUnknownSKU) {
				return all, nil
			}
			return all, err
		}
		if len(xs) < expiryBatch {
			return all, nil
		}
	}
}
