package segments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/lock"
)

// Restocks are idempotent by delivery ID, as orders are by order ID. A
// restock whose reply is lost (a short timeout, a cut connection) may have
// been applied: without an ID, running it again would add the delivery
// twice, and those units would be sold. So every restock names its
// delivery, the ID is claimed in the transaction that adds the units
// (keys.DeliveryID, compared unused), and the delivery's record
// (keys.Delivery) keeps what it did, for a retry to report and for Audit to
// count. The ID is required: an unsafe retry must not be the default.

// MaxDeliveryIDLen is the longest delivery ID, in bytes.
const MaxDeliveryIDLen = MaxOrderIDLen

// ValidateDeliveryID checks a delivery ID: 1 to MaxDeliveryIDLen bytes of
// printable ASCII other than space and '/', as an order ID.
func ValidateDeliveryID(id string) error {
	switch {
	case id == "":
		return invalid("delivery", id, "must not be empty (a restock is idempotent by its delivery ID)")
	case len(id) > MaxDeliveryIDLen:
		return invalid("delivery", id, "is %d bytes, longer than %d", len(id), MaxDeliveryIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f || c == '/' {
			return invalid("delivery", id, "byte %d (%s) is not printable ASCII other than space and '/'", i, DescribeByte(id, i))
		}
	}
	return nil
}

// Delivery is the record of one restock, written in the transaction that
// adds its units.
type Delivery struct {
	V   int    `json:"v"`
	SKU string `json:"sku"`
	ID  string `json:"delivery"`
	Qty int64  `json:"qty"`
	// Total and Pool are the SKU's total and pool right after the restock.
	Total int64     `json:"total"`
	Pool  int64     `json:"pool"`
	At    time.Time `json:"at"`
}

// EncodeDelivery encodes d with the current version.
func EncodeDelivery(d Delivery) string {
	d.V = Version
	return mustJSON(d)
}

// DecodeDelivery strictly decodes the delivery record stored at key.
func DecodeDelivery(key string, value []byte) (Delivery, error) {
	var d Delivery
	if err := strictJSON(value, &d); err != nil {
		return Delivery{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	if err := checkVersion(d.V); err != nil {
		return Delivery{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	if err := firstErr(ValidateSKU(d.SKU), ValidateDeliveryID(d.ID), ValidateQty(d.Qty)); err != nil {
		return Delivery{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	if d.Total < d.Qty || d.Total > MaxTotal || d.Pool < 0 || d.Pool > d.Total {
		return Delivery{}, &CorruptError{Key: key, Value: value,
			Err: fmt.Errorf("total %d and pool %d do not fit a delivery of %d", d.Total, d.Pool, d.Qty)}
	}
	return d, nil
}

// Restock adds a new delivery of qty units to sku's pool and total (a
// returned order is Release, not Restock), under the pool's lock, in one
// transaction that claims the delivery ID and records the delivery.
//
// It is idempotent by delivery: calling Restock again with the same
// delivery, SKU and qty returns the first result with Replayed set, adding
// nothing; the same delivery ID with another SKU or qty is ErrConflict.
// ctx bounds the wait for the pool's lock and the commit. An error after
// the commit was sent (ctx ended, the reply was lost) leaves the outcome
// unknown: the restock may still land, and retrying with the same delivery
// ID tells which (it never adds twice). Any other error changed nothing.
func (e *Engine) Restock(ctx context.Context, sku, delivery string, qty int64) (*Restocked, error) {
	if err := firstErr(ValidateSKU(sku), ValidateDeliveryID(delivery), ValidateQty(qty)); err != nil {
		return nil, fmt.Errorf("restock %s delivery %q: %w", sku, delivery, err)
	}
	fail := func(err error) (*Restocked, error) {
		return nil, fmt.Errorf("restock %s delivery %q: %w", sku, delivery, err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return fail(err)
	}
	// A retry is answered without waiting for the pool's lock.
	claim := e.keys.DeliveryID(delivery)
	if r, done, err := e.replayDelivery(ctx, sku, delivery, qty, nil); done {
		return r, err
	} else if err != nil {
		return fail(err)
	}
	hp, err := e.lockPlace(ctx, info.name, Pool, -1)
	if err != nil {
		return fail(err)
	}
	defer hp.unlock()
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		meta, metaRev, err := e.Meta(ctx, sku)
		if err != nil {
			return fail(err)
		}
		if meta.Total+qty > MaxTotal {
			return fail(&InvalidError{Field: "qty", Value: fmt.Sprint(qty),
				Reason: fmt.Sprintf("would take the total %d past the maximum %d", meta.Total, MaxTotal)})
		}
		if err := hp.load(ctx, false); err != nil {
			return fail(err)
		}
		hp.delta = qty
		meta.Total += qty
		meta.InitialFill = 0 // the counters are no longer as born at the record's revision
		pool := hp.newValue()
		rec := Delivery{SKU: sku, ID: delivery, Qty: qty, Total: meta.Total, Pool: pool, At: time.Now().UTC()}
		resp, err := e.kv.Txn(ctx).
			If(append(hp.cmps(),
				clientv3.Compare(clientv3.ModRevision(e.keys.Meta(sku)), "=", metaRev),
				clientv3.Compare(clientv3.CreateRevision(claim), "=", 0))...).
			Then(append(hp.ops(),
				clientv3.OpPut(e.keys.Meta(sku), EncodeMeta(meta)),
				clientv3.OpPut(claim, sku),
				clientv3.OpPut(e.keys.Delivery(sku, delivery), EncodeDelivery(rec)))...).
			Else(clientv3.OpGet(hp.h.Own().Key()), clientv3.OpGet(claim)).
			Commit()
		if err != nil {
			hp.invalidate()
			return fail(fmt.Errorf("%w (the restock was sent and may still land: retry with the same delivery ID to learn its outcome)", err))
		}
		if resp.Succeeded {
			hp.committed(resp.Header.Revision)
			return &Restocked{SKU: sku, Delivery: delivery, Qty: qty, Total: meta.Total, Pool: pool, Revision: resp.Header.Revision}, nil
		}
		if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
			// The ID was claimed meanwhile (a concurrent retry won).
			r, _, err := e.replayDelivery(ctx, sku, delivery, qty, kvs[0])
			return r, err
		}
		if !stillOwned(resp.Responses[0], hp) {
			return fail(lock.ErrLost)
		}
		hp.invalidate()
	}
	return fail(errContention)
}

// replayDelivery answers a restock whose delivery ID is claimed: the first
// result, or ErrConflict when the ID was used with another SKU or qty. claim
// is the claim as read, or nil to read it now; done is false when the ID is
// not claimed (and err nil).
func (e *Engine) replayDelivery(ctx context.Context, sku, delivery string, qty int64, claim *mvccpb.KeyValue) (r *Restocked, done bool, err error) {
	defer func() {
		if err != nil && done {
			err = fmt.Errorf("restock %s delivery %q: %w", sku, delivery, err)
		}
	}()
	if claim == nil {
		resp, err := e.kv.Get(ctx, e.keys.DeliveryID(delivery))
		if err != nil {
			return nil, false, err
		}
		if len(resp.Kvs) == 0 {
			return nil, false, nil
		}
		claim = resp.Kvs[0]
	}
	if owner := string(claim.Value); owner != sku {
		return nil, true, fmt.Errorf("%w: delivery ID %q was already used for SKU %q", ErrConflict, delivery, owner)
	}
	key := e.keys.Delivery(sku, delivery)
	resp, err := e.kv.Get(ctx, key)
	if err != nil {
		return nil, true, err
	}
	if len(resp.Kvs) == 0 {
		return nil, true, &CorruptError{Key: string(claim.Key), Value: claim.Value, Err: errors.New("a claimed delivery ID without its record")}
	}
	d, err := DecodeDelivery(key, resp.Kvs[0].Value)
	if err != nil {
		return nil, true, err
	}
	if d.SKU != sku || d.ID != delivery {
		return nil, true, &CorruptError{Key: key, Value: resp.Kvs[0].Value, Err: fmt.Errorf("record names SKU %q delivery %q", d.SKU, d.ID)}
	}
	if d.Qty != qty {
		return nil, true, fmt.Errorf("%w: delivery %q was already applied with qty %d, not %d", ErrConflict, delivery, d.Qty, qty)
	}
	return &Restocked{SKU: sku, Delivery: delivery, Qty: d.Qty, Total: d.Total, Pool: d.Pool,
		Revision: resp.Kvs[0].CreateRevision, Replayed: true}, true, nil
}
