package segments

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Release returns an order's stock to the places it came from and marks the
// order released, in one transaction: a segment's units go to its inbox
// (which counts as the segment's stock at once, see Refill), the pool's to
// the pool. It takes no segment lock (only a segment's lock holder writes
// its counter, and anyone may add to its inbox), so it never waits for, nor
// disturbs, the processes selling from those segments; it takes the pool's
// lock only for an order that took from the pool. The transaction commits
// only if the order record and every key it adds to are as read. Releasing again reports
// Released false and returns nothing; an order that was never allocated is
// ErrOrderNotFound. The order ID stays used: allocating it again replays the
// (released) first result.
//
// A live reservation can be released (as Cancel does); a confirmed one too
// (a paid order returned). A reservation that expired is *ExpiredError: its
// units went back already. Units counted against a buyer's per-user limit
// are taken off the buyer's counter in the same transaction.
func (e *Engine) Release(ctx context.Context, sku, order string) (out *Released, outErr error) {
	defer func() { e.metrics.released("release", sku, out, outErr) }()
	if err := firstErr(ValidateSKU(sku), ValidateOrderID(order)); err != nil {
		return nil, fmt.Errorf("release %s order %q: %w", sku, order, err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("release %s order %q: %w", sku, order, err)
	}
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		r, retry, err := e.releaseOnce(ctx, info, order)
		if err != nil {
			return nil, fmt.Errorf("release %s order %q: %w", sku, order, err)
		}
		if !retry {
			return r, nil
		}
		if err := returnBackoff(ctx, attempt); err != nil {
			return nil, fmt.Errorf("release %s order %q: %w", sku, order, err)
		}
	}
	return nil, fmt.Errorf("release %s order %q: %w", sku, order, errContention)
}

func (e *Engine) releaseOnce(ctx context.Context, info *skuInfo, order string) (r *Released, retry bool, err error) {
	return e.returnOnce(ctx, info, order, retRelease, time.Time{}, nil)
}

// returnKind says why an order's units go back.
type returnKind int

const (
	retRelease returnKind = iota // Release: any active order
	retCancel                    // Cancel: a live reservation only
	retExpire                    // the sweep or a late Confirm: a reservation past its deadline
)

// errNotDue is returnOnce's answer, in retExpire, for an order that is not a
// live reservation past its deadline at now: nothing was done.
var errNotDue = errors.New("coordinator: not a reservation due for expiry")

// returnOnce reads order and, if kind allows it, returns its units and marks
// it (released, or expired) in one transaction that compares the order
// record's revision, every counter it adds to, and fence: so two callers
// (a sweep and a Confirm, two sweeping leaders) can never both return it.
// The same transaction deletes a live reservation's index key and takes
// the units off the buyer's counter when they were counted there. retry
// means a compare failed: read again.
func (e *Engine) returnOnce(ctx context.Context, info *skuInfo, order string, kind returnKind, now time.Time, fence []clientv3.Cmp) (r *Released, retry bool, err error) {
	o, kv, err := e.readOrder(ctx, info.name, order)
	if err != nil {
		return nil, false, err
	}
	r = &Released{SKU: o.SKU, Order: o.ID, Qty: o.Qty, Parts: o.Parts, Revision: kv.ModRevision, State: o.State, Buyer: o.Buyer}
	expired := &ExpiredError{SKU: o.SKU, Order: o.ID, Deadline: o.Deadline, Revision: kv.ModRevision}
	switch kind {
	case retRelease:
		if o.State == StateExpired {
			return nil, false, expired
		}
		if o.Released {
			return r, false, nil
		}
	case retCancel:
		switch {
		case o.State == "":
			return nil, false, fmt.Errorf("%w: order %q is a plain allocation, not a reservation (use release)", ErrConflict, order)
		case o.State == StateConfirmed:
			return nil, false, fmt.Errorf("%w: reservation %q was confirmed; a paid order is returned by release", ErrConflict, order)
		case o.State == StateExpired:
			return nil, false, expired
		case o.Released:
			return r, false, nil
		}
	case retExpire:
		if !o.Reserved() || now.Before(o.Deadline) {
			return r, false, errNotDue
		}
	}
	// Where each part goes back to: a segment's inbox, or the pool.
	give := map[string]int64{}
	var targets []string
	for _, p := range o.Parts {
		if p.Place.Index() >= info.segments {
			return nil, false, &CorruptError{Key: string(kv.Key), Value: kv.Value,
				Err: fmt.Errorf("part from %v of a SKU with %d segments", p.Place, info.segments)}
		}
		key := e.keys.Pool(info.name)
		if !p.Place.IsPool() {
			key = e.keys.Inbox(info.name, p.Place.Index())
		}
		if _, ok := give[key]; !ok {
			targets = append(targets, key)
		}
		give[key] += p.Qty
	}
	poolKey := e.keys.Pool(info.name)
	var poolCmps []clientv3.Cmp
	if _, ok := give[poolKey]; ok {
		hp, err := e.lockPlace(ctx, info.name, Pool, -1)
		if err != nil {
			return nil, false, err
		}
		defer hp.unlock()
		poolCmps = append(poolCmps, hp.h.IsOwner())
		defer hp.invalidate() // the pool changes under this lock, not through its cache
	}
	reads := make([]clientv3.Op, len(targets), len(targets)+1)
	for i, key := range targets {
		reads[i] = clientv3.OpGet(key)
	}
	userKey := ""
	if o.UserCounted {
		userKey = e.keys.User(info.name, o.Buyer)
		reads = append(reads, clientv3.OpGet(userKey))
	}
	cur, err := e.kv.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		return nil, false, err
	}
	orderKey := string(kv.Key)
	cmps := append(append(poolCmps, fence...), clientv3.Compare(clientv3.ModRevision(orderKey), "=", kv.ModRevision))
	var ops []clientv3.Op
	for i, key := range targets {
		v, mod, err := decodeCounterKV(key, cur.Responses[i].GetResponseRange())
		if err != nil {
			return nil, false, err
		}
		if v+give[key] > MaxTotal {
			return nil, false, fmt.Errorf("%w: returning %d to %s would exceed the maximum", ErrCorrupt, give[key], key)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", mod))
		ops = append(ops, clientv3.OpPut(key, EncodeCounter(v+give[key])))
	}
	if userKey != "" {
		v, mod, err := decodeCounterKV(userKey, cur.Responses[len(targets)].GetResponseRange())
		if err != nil {
			return nil, false, err
		}
		if v < o.Qty {
			return nil, false, fmt.Errorf("%w: buyer counter %s holds %d, less than order %q's %d", ErrCorrupt, userKey, v, order, o.Qty)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(userKey), "=", mod))
		if v == o.Qty {
			ops = append(ops, clientv3.OpDelete(userKey))
		} else {
			ops = append(ops, clientv3.OpPut(userKey, EncodeCounter(v-o.Qty)))
		}
	}
	if o.State == StateReserved {
		ops = append(ops, clientv3.OpDelete(e.keys.Reservation(info.name, o.Deadline.UnixNano(), o.ID)))
	}
	if kind == retExpire {
		o.State = StateExpired
	} else {
		o.Released = true
	}
	ops = append(ops, clientv3.OpPut(orderKey, EncodeOrder(o)))
	send := func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	}
	var resp *clientv3.TxnResponse
	if kind == retExpire {
		// As a rebalancer's move: never abandoned once sent.
		resp, err = e.commitMove(ctx, send)
	} else {
		resp, err = send(ctx)
	}
	if userKey != "" {
		e.users.forget(userKey) // the committer reads it again
	}
	if err != nil {
		return nil, false, err
	}
	if !resp.Succeeded {
		if len(fence) > 0 {
			if err := e.checkFence(ctx, fence); err != nil {
				return nil, false, err
			}
		}
		// The order or a counter changed, or the pool's lock was lost:
		// read again.
		return nil, true, nil
	}
	r.Released, r.Revision, r.State = true, resp.Header.Revision, o.State
	return r, false, nil
}

// returnBackoff waits before attempt+1 of a return whose compares failed: a
// random pause, doubling with each attempt (at most 64 ms), so that returns
// to one segment's inbox from many callers at once (releases, cancels) do
// not keep failing each other's compares in lockstep. It returns ctx's
// cause if ctx ends first.
func returnBackoff(ctx context.Context, attempt int) error {
	d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
