package segments

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Reservations. A flash-sale order takes its stock before it is paid:
// Reserve takes the units as Allocate does and records the order as a
// reservation with a deadline; Confirm (the payment) makes it final;
// Cancel, or the deadline passing, gives the units back.
//
// Lifecycle of a reservation's record (Order.State):
//
//	reserved ──Confirm──▶ confirmed ──Release──▶ released
//	   │ ╲
//	   │  ╲──deadline (sweep, or a late Confirm)──▶ expired (units back)
//	   └──Cancel / Release──▶ released (units back)
//
// Every transition is one etcd transaction that compares the order
// record's ModRevision as read: a Confirm and an expiry racing for one
// reservation compare the same revision, so exactly one of them commits and
// a reservation is never both confirmed and expired.
//
// The deadline is the committing process's clock at the commit plus the
// TTL. The sweep (rebalance) and Confirm judge it by their own clocks; a
// skew of ε between hosts makes a reservation last TTL ± ε. It never makes
// a reservation both confirmed and expired, nor returns its units twice.

// Reserve takes qty units of sku for an order, as Allocate does (same
// routing, fallback and refusal rules, same idempotency by order ID), and
// records the order as a reservation that expires ttl after its commit
// unless Confirm is called first. An expired reservation's units go back to
// the SKU (the inbox of the segment its order ID routes to, or, when the
// sweep expires many in one transaction, the one the first of them routes
// to), by the elected rebalancer's sweep (rebalance), normally well within
// a second of the deadline.
//
// ttl must be more than 0 and at most MaxReservationTTL. A retry
// with the same order, SKU, qty and buyer returns the first result with
// Replayed set (and the first deadline: the new ttl is ignored); an order ID
// already used on this SKU for a plain allocation, or with another qty or
// buyer, is ErrConflict. On a SKU with a per-user limit, WithBuyer is required and
// the reservation counts against the buyer's limit until it expires or is
// cancelled.
func (e *Engine) Reserve(ctx context.Context, sku, order string, qty int64, routeKey string, ttl time.Duration, opts ...OrderOption) (*Allocation, error) {
	return e.allocate(ctx, "reserve", sku, order, qty, routeKey, nil, ttl, opts)
}

// Confirm makes a live reservation a final allocation, in one transaction
// that compares the reservation's record as read and deletes its index key.
// It is idempotent: confirming a confirmed reservation returns the first
// confirmation with Replayed set.
//
// Errors, each changing nothing: ErrOrderNotFound (no such order of sku);
// *ExpiredError (ErrExpired) when the reservation expired, including when
// this call finds it past its deadline by this process's clock and not yet
// swept: Confirm then expires it itself (its units go back, in the same
// fenced way as the sweep), so that ErrExpired is final and a later Confirm
// elsewhere cannot succeed; ErrConflict for a plain allocation (nothing to
// confirm) and for a reservation that was cancelled or released.
func (e *Engine) Confirm(ctx context.Context, sku, order string) (out *Confirmed, outErr error) {
	defer func() { e.metrics.confirmed(sku, out, outErr) }()
	if err := firstErr(ValidateSKU(sku), ValidateOrderID(order)); err != nil {
		return nil, fmt.Errorf("confirm %s order %q: %w", sku, order, err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("confirm %s order %q: %w", sku, order, err)
	}
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		r, retry, err := e.confirmOnce(ctx, info, order)
		if err != nil {
			return nil, fmt.Errorf("confirm %s order %q: %w", sku, order, err)
		}
		if !retry {
			return r, nil
		}
	}
	return nil, fmt.Errorf("confirm %s order %q: %w", sku, order, errContention)
}

func (e *Engine) confirmOnce(ctx context.Context, info *skuInfo, order string) (*Confirmed, bool, error) {
	o, kv, err := e.readOrder(ctx, info.name, order)
	if err != nil {
		return nil, false, err
	}
	if o.Lines != nil {
		// A line of an order of several: the whole order is confirmed
		// (cartreturn.go).
		cs, retry, err := e.confirmLines(ctx, o, false)
		if cs == nil {
			return nil, retry, err
		}
		return lineOf(o, cs), retry, err
	}
	r := &Confirmed{SKU: o.SKU, Order: o.ID, Qty: o.Qty, Parts: o.Parts, Buyer: o.Buyer, Deadline: o.Deadline, Revision: kv.ModRevision}
	switch {
	case o.State == "":
		return nil, false, fmt.Errorf("%w: the order is a plain allocation, not a reservation", ErrConflict)
	case o.State == StateExpired:
		return nil, false, &ExpiredError{SKU: o.SKU, Order: o.ID, Deadline: o.Deadline, Revision: kv.ModRevision}
	case o.Released:
		return nil, false, fmt.Errorf("%w: the reservation was cancelled or released", ErrConflict)
	case o.State == StateConfirmed:
		r.Replayed = true
		return r, false, nil
	}
	if now := time.Now(); !now.Before(o.Deadline) {
		// Past the deadline by this clock: expire it here rather than
		// refuse and leave it live, so that the refusal is final.
		x, retry, err := e.returnOnce(ctx, info, order, retExpire, now, nil)
		switch {
		case errors.Is(err, errNotDue) || retry:
			return nil, true, nil // changed meanwhile: read again
		case err != nil:
			return nil, false, err
		}
		return nil, false, &ExpiredError{SKU: o.SKU, Order: o.ID, Deadline: o.Deadline, Revision: x.Revision}
	}
	o.State = StateConfirmed
	// One transaction comparing the record's revision, committed together
	// with the other Confirms of this process (confirmer.go).
	rev, err := e.commitConfirm(ctx, &confirmReq{key: string(kv.Key), modRev: kv.ModRevision,
		value: EncodeOrder(o), indexKey: e.keys.Reservation(info.name, o.Deadline.UnixNano(), o.ID)})
	if err != nil {
		return nil, false, err
	}
	if rev == 0 {
		return nil, true, nil // expired, cancelled or confirmed meanwhile
	}
	r.Revision = rev
	return r, false, nil
}

// Cancel gives a live reservation's units back (to the places they came
// from, as Release does) and marks it released, in one transaction. It is
// idempotent: cancelling a cancelled reservation reports Released false.
//
// Cancel is only for reservations. Errors, each changing nothing:
// ErrOrderNotFound; ErrConflict for a confirmed reservation (a paid order
// goes back with Release, which says so explicitly) and for a plain
// allocation; *ExpiredError (ErrExpired) for a reservation that expired, its
// units already back.
func (e *Engine) Cancel(ctx context.Context, sku, order string) (out *Released, outErr error) {
	defer func() { e.metrics.released("cancel", sku, out, outErr) }()
	if err := firstErr(ValidateSKU(sku), ValidateOrderID(order)); err != nil {
		return nil, fmt.Errorf("cancel %s order %q: %w", sku, order, err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("cancel %s order %q: %w", sku, order, err)
	}
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		r, retry, err := e.returnOnce(ctx, info, order, retCancel, time.Time{}, nil)
		if err != nil {
			return nil, fmt.Errorf("cancel %s order %q: %w", sku, order, err)
		}
		if !retry {
			return r, nil
		}
		if err := returnBackoff(ctx, attempt); err != nil {
			return nil, fmt.Errorf("cancel %s order %q: %w", sku, order, err)
		}
	}
	return nil, fmt.Errorf("cancel %s order %q: %w", sku, order, errContention)
}

// due is a reservation index key found due, and its order.
type due struct {
	key   string
	order string
}

// DefaultExpiryWorkers is how many reservations ExpireDue returns at once
// when it expires them one transaction each (those a batch could not take:
// see expire_batch.go). Each takes three round trips (read the order, read
// the counters it adds to, commit).
const DefaultExpiryWorkers = 8

// ExpireDue returns the units of sku's reservations whose deadline is at or
// before now (by the caller's clock), at most limit of them (the earliest
// first), and marks them expired. Every transaction that expires some is
// fenced by fence (the rebalancer passes its leadership compare) and by
// each reservation's record as read, so a reservation confirmed, cancelled
// or expired by someone else meanwhile is skipped, never returned twice.
// Due reservations are expired together, as many as fit one transaction,
// and one at a time when a batch's compares fail.
// It returns what it expired. An error with fence failing is ErrFenced; the
// reservations expired before an error are returned with it.
func (e *Engine) ExpireDue(ctx context.Context, sku string, now time.Time, limit int, fence ...clientv3.Cmp) (expired []Expiry, outErr error) {
	defer func() { e.metrics.expired(sku, expired) }()
	if err := ValidateSKU(sku); err != nil {
		return nil, fmt.Errorf("expire %s: %w", sku, err)
	}
	if limit < 1 {
		return nil, fmt.Errorf("expire %s: %w: limit %d must be positive", sku, ErrInvalid, limit)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("expire %s: %w", sku, err)
	}
	resp, err := e.kv.Get(ctx, e.keys.Reservations(sku),
		clientv3.WithRange(e.keys.ReservationsDueEnd(sku, now.UnixNano())), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("expire %s: %w", sku, err)
	}
	var todo []due
	for _, kv := range resp.Kvs {
		_, order, err := e.keys.ParseReservation(sku, string(kv.Key))
		if err != nil {
			return nil, fmt.Errorf("expire %s: %w", sku, &CorruptError{Key: string(kv.Key), Err: err})
		}
		todo = append(todo, due{string(kv.Key), order})
	}
	// Two batched passes (the second reads again what the first could not
	// commit: a seller absorbing an inbox meanwhile is common in a busy
	// sale), then one at a time for the rest.
	var out, xs []Expiry
	var singles []due
	for pass := 0; pass < 2 && len(todo) > 0; pass++ {
		batch, single, err := e.readDue(ctx, info, todo, now)
		if err != nil {
			return out, fmt.Errorf("expire %s: %w", sku, err)
		}
		singles = append(singles, single...)
		xs, todo, err = e.expireBatch(ctx, info, batch, fence)
		out = append(out, xs...)
		if err != nil {
			return out, fmt.Errorf("expire %s: %w", sku, err)
		}
	}
	todo = append(singles, todo...)
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	work := make(chan due)
	for range min(DefaultExpiryWorkers, len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range work {
				x, err := e.expireOne(ctx, info, d.key, d.order, now, fence)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if x != nil {
					out = append(out, *x)
				}
				mu.Unlock()
			}
		}()
	}
	for _, d := range todo {
		mu.Lock()
		stop := firstErr != nil
		mu.Unlock()
		if stop {
			break
		}
		work <- d
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return out, fmt.Errorf("expire %s: %w", sku, firstErr)
	}
	return out, nil
}

// expireOne expires one due reservation; nil, nil when it was not (any
// more) a live reservation past its deadline.
func (e *Engine) expireOne(ctx context.Context, info *skuInfo, indexKey, order string, now time.Time, fence []clientv3.Cmp) (*Expiry, error) {
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		r, retry, err := e.returnOnce(ctx, info, order, retExpire, now, fence)
		switch {
		case errors.Is(err, errNotDue):
			// Confirmed or cancelled between the index read and the
			// order's (their transaction deleted the index key), or an
			// index key its order does not account for: drop the latter,
			// or the sweep would find it forever.
			return nil, e.dropStrayIndex(ctx, info, indexKey, order, fence)
		case errors.Is(err, ErrOrderNotFound):
			return nil, e.dropStrayIndex(ctx, info, indexKey, order, fence)
		case errors.Is(err, errConfirmedInstead):
			return nil, nil // its order over several clusters was committed
		case errors.Is(err, errUndecided):
			// The cluster of its order's decision is unreachable: the
			// lines stay held until it answers; the others go on.
			e.log.Warn("reservation of an order over several clusters not expired", "sku", info.name, "order", order, "err", err)
			return nil, nil
		case err != nil:
			return nil, err
		case retry:
			continue
		}
		return &Expiry{SKU: r.SKU, Order: r.Order, Qty: r.Qty, Buyer: r.Buyer, Deadline: e.deadlineOf(indexKey, info.name),
			Revision: r.Revision, At: time.Now()}, nil
	}
	return nil, errContention
}

func (e *Engine) deadlineOf(indexKey, sku string) time.Time {
	ns, _, _ := e.keys.ParseReservation(sku, indexKey)
	return time.Unix(0, ns).UTC()
}

// dropStrayIndex deletes a reservation index key whose order is not a live
// reservation with that deadline, if it still exists.
func (e *Engine) dropStrayIndex(ctx context.Context, info *skuInfo, indexKey, order string, fence []clientv3.Cmp) error {
	o, _, err := e.readOrder(ctx, info.name, order)
	if err == nil && o.Reserved() && e.keys.Reservation(info.name, o.Deadline.UnixNano(), o.ID) == indexKey {
		return nil // a live reservation not yet due by our clock: keep it
	}
	if err != nil && !errors.Is(err, ErrOrderNotFound) {
		return err
	}
	resp, err := e.kv.Txn(ctx).If(append(fence[:len(fence):len(fence)],
		clientv3.Compare(clientv3.CreateRevision(indexKey), ">", 0))...).
		Then(clientv3.OpDelete(indexKey)).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return e.checkFence(ctx, fence)
	}
	return nil
}

// NextExpiry is NextDeadline for a caller: sku must be a valid name of a
// SKU that exists (an error says which it is not).
func (e *Engine) NextExpiry(ctx context.Context, sku string) (time.Time, bool, error) {
	if err := ValidateSKU(sku); err != nil {
		return time.Time{}, false, fmt.Errorf("next expiry of %s: %w", sku, err)
	}
	if _, err := e.sku(ctx, sku); err != nil {
		return time.Time{}, false, fmt.Errorf("next expiry of %s: %w", sku, err)
	}
	return e.NextDeadline(ctx, sku)
}

// NextDeadline returns the earliest deadline of sku's live reservations,
// and false when it has none.
func (e *Engine) NextDeadline(ctx context.Context, sku string) (time.Time, bool, error) {
	resp, err := e.kv.Get(ctx, e.keys.Reservations(sku), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("next deadline of %s: %w", sku, err)
	}
	if len(resp.Kvs) == 0 {
		return time.Time{}, false, nil
	}
	ns, _, err := e.keys.ParseReservation(sku, string(resp.Kvs[0].Key))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("next deadline of %s: %w", sku, err)
	}
	return time.Unix(0, ns), true, nil
}
