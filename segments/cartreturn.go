package segments

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The whole-order transitions of an order of several lines (cart.go):
// release, cancel, expiry and confirm, each one transaction over every
// line's record. Whatever reaches one line (ReleaseOrder and the others,
// but also the single-SKU Release, Cancel and Confirm, and the expiry
// sweep of any of its SKUs) acts on the whole order, so its lines never
// part: all held, all returned, all confirmed or all expired.

// OrderReleased is the outcome of ReleaseOrder and CancelOrder.
type OrderReleased struct {
	Order string
	// Lines are the lines' outcomes, by SKU name.
	Lines []*Released
	// Released is false when the order had been released (or cancelled)
	// already: nothing was returned by this call.
	Released bool
	// Revision is the revision of the release (of the earlier one when
	// Released is false).
	Revision int64
	// State is the order's reservation state ("" for a plain allocation).
	State OrderState
}

// OrderConfirmed is the outcome of ConfirmOrder.
type OrderConfirmed struct {
	Order string
	// Lines are the lines' outcomes, by SKU name.
	Lines []*Confirmed
	// Revision is the revision of the confirmation (of the first one when
	// Replayed).
	Revision int64
	// Replayed is true when the order had been confirmed before this call.
	Replayed bool
}

// ReleaseOrder returns every line of an order (Release's rules, line by
// line, in one transaction). sku is any SKU of the order: its record lists
// the others. An order of one SKU (Allocate) is released as Release does.
func (e *Engine) ReleaseOrder(ctx context.Context, sku, order string) (*OrderReleased, error) {
	return e.returnOrder(ctx, "release", sku, order, retRelease)
}

// CancelOrder cancels every line of a reserved order (Cancel's rules, in
// one transaction). sku is any SKU of the order.
func (e *Engine) CancelOrder(ctx context.Context, sku, order string) (*OrderReleased, error) {
	return e.returnOrder(ctx, "cancel", sku, order, retCancel)
}

func (e *Engine) returnOrder(ctx context.Context, verb, sku, order string, kind returnKind) (*OrderReleased, error) {
	fail := func(err error) (*OrderReleased, error) {
		return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order, err)
	}
	if err := firstErr(ValidateSKU(sku), ValidateOrderID(order)); err != nil {
		return fail(err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return fail(err)
	}
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		o, _, err := e.readOrder(ctx, sku, order)
		if err != nil {
			return fail(err)
		}
		var rs []*Released
		var retry bool
		if o.Lines == nil {
			var r *Released
			if r, retry, err = e.returnOnce(ctx, info, order, kind, time.Time{}, nil); r != nil {
				rs = []*Released{r}
			}
		} else {
			rs, retry, err = e.returnLines(ctx, o, kind, time.Time{}, nil)
		}
		if err != nil {
			return fail(err)
		}
		if !retry {
			out := &OrderReleased{Order: order, Lines: rs}
			for _, r := range rs {
				out.Released, out.Revision, out.State = r.Released, r.Revision, r.State
			}
			return out, nil
		}
		if err := returnBackoff(ctx, attempt); err != nil {
			return fail(err)
		}
	}
	return fail(errContention)
}

// readLineRecords reads the record of order at every SKU of lines, in one
// transaction; a line without its record is nil.
func (e *Engine) readLineRecords(ctx context.Context, order string, lines []string) ([]Order, []*mvccpb.KeyValue, error) {
	ops := make([]clientv3.Op, len(lines))
	for i, sku := range lines {
		ops[i] = clientv3.OpGet(e.keys.Order(sku, order))
	}
	resp, err := e.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("read order: %w", err)
	}
	os := make([]Order, len(lines))
	kvs := make([]*mvccpb.KeyValue, len(lines))
	for i, sku := range lines {
		got := resp.Responses[i].GetResponseRange().GetKvs()
		if len(got) == 0 {
			continue
		}
		o, err := DecodeOrder(string(got[0].Key), got[0].Value)
		if err != nil {
			return nil, nil, err
		}
		if o.IsPruned() && o.SKU == sku && o.ID == order {
			// One line was archived (Prune works SKU by SKU): its units
			// are in the archive, so the order can no longer move whole.
			return nil, nil, &OrderPrunedError{SKU: o.SKU, Order: o.ID, Pruned: o.PrunedAt}
		}
		if o.SKU != sku || o.ID != order || !slices.Equal(o.Lines, lines) {
			return nil, nil, &CorruptError{Key: string(got[0].Key), Value: got[0].Value,
				Err: fmt.Errorf("record of an order of the lines %v names SKU %q order %q lines %v", lines, o.SKU, o.ID, o.Lines)}
		}
		os[i], kvs[i] = o, got[0]
	}
	return os, kvs, nil
}

// returnLines returns every line of the order o is a line of (kind, as
// returnOnce does for one), in one transaction that compares every line's
// record and every counter it adds to, and fence. The lines' results are
// in o.Lines' order; retry means a compare failed (read again).
func (e *Engine) returnLines(ctx context.Context, o Order, kind returnKind, now time.Time, fence []clientv3.Cmp) (rs []*Released, retry bool, err error) {
	os, kvs, err := e.readLineRecords(ctx, o.ID, o.Lines)
	if err != nil {
		return nil, false, err
	}
	rs = make([]*Released, len(os))
	for i, lo := range os {
		if kvs[i] == nil {
			continue
		}
		rs[i] = &Released{SKU: lo.SKU, Order: lo.ID, Qty: lo.Qty, Parts: lo.Parts, Revision: kvs[i].ModRevision, State: lo.State, Buyer: lo.Buyer}
	}
	// Every line moves with the others, so their verdicts agree; the first
	// that says no is the answer.
	for i, lo := range os {
		if kvs[i] == nil {
			continue
		}
		if proceed, err := returnVerdict(kind, lo, kvs[i].ModRevision, now); !proceed {
			if err != nil && !errors.Is(err, errNotDue) {
				return nil, false, err
			}
			return rs, false, err
		}
	}
	if kind == retExpire && len(o.Across) > 0 {
		// An order over several clusters follows its commit decision
		// (across.go): committed, its lines are confirmed, not expired.
		committed, err := e.abortAcross(ctx, o)
		if err != nil {
			return nil, false, fmt.Errorf("%w: order %q: %w", errUndecided, o.ID, err)
		}
		if committed {
			_, retry, err := e.confirmLines(ctx, o, true)
			if err != nil || retry {
				return nil, retry, err
			}
			return nil, false, errConfirmedInstead
		}
	}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for i, lo := range os {
		if kvs[i] == nil {
			// Its SKU was deleted (DeleteSKU archives the records) or
			// the record pruned: the order can no longer move whole.
			return nil, false, fmt.Errorf("%w: line %s of order %q has no record any more (its SKU deleted, or pruned) while the others are active",
				ErrConflict, o.Lines[i], o.ID)
		}
		info, err := e.sku(ctx, lo.SKU)
		if err != nil {
			return nil, false, err
		}
		targets, err := e.returnTargets(info, lo, kvs[i])
		if err != nil {
			return nil, false, err
		}
		c, w, userKey, err := e.returnOps(ctx, info, lo, kvs[i], targets)
		if userKey != "" {
			defer e.users.forget(userKey)
		}
		if errors.Is(err, errOrderChanged) {
			return nil, true, nil
		}
		if err != nil {
			return nil, false, err
		}
		if kind == retExpire {
			lo.State = StateExpired
		} else {
			lo.Released = true
		}
		cmps = append(cmps, c...)
		ops = append(append(ops, w...), clientv3.OpPut(string(kvs[i].Key), EncodeOrder(lo)))
		rs[i].State = lo.State
	}
	cmps = append(fence[:len(fence):len(fence)], cmps...)
	send := func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	}
	var resp *clientv3.TxnResponse
	if kind == retExpire {
		resp, err = e.commitMove(ctx, send)
	} else {
		resp, err = send(ctx)
	}
	if err != nil {
		return nil, false, err
	}
	if !resp.Succeeded {
		if err := e.checkFence(ctx, fence); err != nil {
			return nil, false, err
		}
		return nil, true, nil
	}
	for _, r := range rs {
		r.Released, r.Revision = true, resp.Header.Revision
	}
	return rs, false, nil
}

// lineOf is the result of o's own line among rs (returnLines' order).
func lineOf[T any](o Order, rs []*T) *T {
	if i, ok := slices.BinarySearch(o.Lines, o.SKU); ok && i < len(rs) {
		return rs[i]
	}
	return nil
}

// ConfirmOrder confirms every line of a reserved order (Confirm's rules, in
// one transaction). sku is any SKU of the order. An order of one SKU
// (Reserve) is confirmed as Confirm does.
func (e *Engine) ConfirmOrder(ctx context.Context, sku, order string) (*OrderConfirmed, error) {
	fail := func(err error) (*OrderConfirmed, error) {
		return nil, fmt.Errorf("confirm %s order %q: %w", sku, order, err)
	}
	if err := firstErr(ValidateSKU(sku), ValidateOrderID(order)); err != nil {
		return fail(err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return fail(err)
	}
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		o, _, err := e.readOrder(ctx, sku, order)
		if err != nil {
			return fail(err)
		}
		var cs []*Confirmed
		var retry bool
		if o.Lines == nil {
			var c *Confirmed
			if c, retry, err = e.confirmOnce(ctx, info, order); c != nil {
				cs = []*Confirmed{c}
			}
		} else {
			cs, retry, err = e.confirmLines(ctx, o, false)
		}
		if err != nil {
			return fail(err)
		}
		if !retry {
			out := &OrderConfirmed{Order: order, Lines: cs}
			for _, c := range cs {
				out.Revision, out.Replayed = c.Revision, c.Replayed
			}
			return out, nil
		}
	}
	return fail(errContention)
}

// confirmLines confirms every line of the order o is a line of, in one
// transaction comparing every record as read and deleting every index
// key; an order past its deadline by this clock is expired instead (all
// lines), as confirmOnce does for one, unless decided (the commit decision
// of an order over several clusters: confirmed whatever the deadline).
// retry: read again.
func (e *Engine) confirmLines(ctx context.Context, o Order, decided bool) ([]*Confirmed, bool, error) {
	os, kvs, err := e.readLineRecords(ctx, o.ID, o.Lines)
	if err != nil {
		return nil, false, err
	}
	cs := make([]*Confirmed, len(os))
	confirmed := 0
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for i, lo := range os {
		if kvs[i] == nil {
			return nil, false, fmt.Errorf("%w: line %s of order %q has no record any more (its SKU deleted, or pruned)", ErrConflict, o.Lines[i], o.ID)
		}
		cs[i] = &Confirmed{SKU: lo.SKU, Order: lo.ID, Qty: lo.Qty, Parts: lo.Parts, Buyer: lo.Buyer, Deadline: lo.Deadline, Revision: kvs[i].ModRevision}
		switch {
		case lo.State == "":
			return nil, false, fmt.Errorf("%w: the order is a plain allocation, not a reservation", ErrConflict)
		case lo.State == StateExpired:
			return nil, false, &ExpiredError{SKU: lo.SKU, Order: lo.ID, Deadline: lo.Deadline, Revision: kvs[i].ModRevision}
		case lo.Released:
			return nil, false, fmt.Errorf("%w: the reservation was cancelled or released", ErrConflict)
		case lo.State == StateConfirmed:
			confirmed++
			cs[i].Replayed = true
			continue
		}
		if now := time.Now(); !decided && !now.Before(lo.Deadline) {
			x, retry, err := e.returnLines(ctx, o, retExpire, now, nil)
			switch {
			case errors.Is(err, errNotDue) || errors.Is(err, errConfirmedInstead) || retry:
				return nil, true, nil
			case err != nil:
				return nil, false, err
			}
			return nil, false, &ExpiredError{SKU: lo.SKU, Order: lo.ID, Deadline: lo.Deadline, Revision: x[0].Revision}
		}
		lo.State = StateConfirmed
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kvs[i].Key)), "=", kvs[i].ModRevision))
		ops = append(ops, clientv3.OpPut(string(kvs[i].Key), EncodeOrder(lo)),
			clientv3.OpDelete(e.keys.Reservation(lo.SKU, lo.Deadline.UnixNano(), lo.ID)))
	}
	switch confirmed {
	case len(os):
		return cs, false, nil
	case 0:
	default:
		return nil, false, fmt.Errorf("%w: order %q has %d of its %d lines confirmed", ErrCorrupt, o.ID, confirmed, len(os))
	}
	resp, err := e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, false, err
	}
	if !resp.Succeeded {
		return nil, true, nil // expired, cancelled or confirmed meanwhile
	}
	for _, c := range cs {
		c.Revision = resp.Header.Revision
	}
	return cs, false, nil
}
