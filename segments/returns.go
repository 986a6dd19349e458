package segments

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stockctl/stockctl/internal/background"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Release returns an order's stock and marks the order released, in one
// transaction: its units go to the inbox of the segment the order's ID
// routes to (which counts as the segment's stock at once, see Refill),
// whichever places they came from (stock is fungible; the rebalancer
// drains into the pool what a segment does not sell; returnSegment). The
// transaction is shared with the other Releases and Cancels of this
// process at that moment, and then a SKU's units in it all go to the inbox
// the first of them routes to (return_batch.go). It takes no lock at all
// (only a segment's lock holder writes its counter, and anyone may add to
// its inbox), so it never waits for, nor disturbs, the processes selling
// from those segments or pulling from the pool. The transaction commits
// only if the order record and every key it adds to are as read. Releasing again
// reports Released false and returns nothing; an order that was never
// allocated is ErrOrderNotFound. The order ID stays used: allocating it
// again replays the (released) first result.
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

// returnOnce reads order and, if kind allows it (returnVerdict), returns
// its units and marks it (released, or expired) in one transaction that
// compares the order record's revision and every counter it adds to or
// takes from: so two callers (a Release and a Cancel, a sweep and a
// Confirm) can never both return it. The same transaction deletes a live
// reservation's index key and takes the units off the buyer's counter when
// they were counted there. A Release or a Cancel shares its transaction
// with the others of the moment (return_batch.go); an expiry has one of
// its own, which also compares fence (the sweeping leader's). retry means
// the record or a counter changed: read again.
func (e *Engine) returnOnce(ctx context.Context, info *skuInfo, order string, kind returnKind, now time.Time, fence []clientv3.Cmp) (r *Released, retry bool, err error) {
	o, kv, err := e.readOrder(ctx, info.name, order)
	if err != nil {
		return nil, false, err
	}
	if o.Lines != nil {
		// A line of an order of several: the whole order goes (cartreturn.go).
		rs, retry, err := e.returnLines(ctx, o, kind, now, fence)
		if rs == nil {
			return nil, retry, err
		}
		return lineOf(o, rs), retry, err
	}
	r = &Released{SKU: o.SKU, Order: o.ID, Qty: o.Qty, Parts: o.Parts, Revision: kv.ModRevision, State: o.State, Buyer: o.Buyer}
	if proceed, err := returnVerdict(kind, o, kv.ModRevision, now); !proceed {
		if err != nil && !errors.Is(err, errNotDue) {
			return nil, false, err
		}
		return r, false, err
	}
	if kind != retExpire {
		// A Release or a Cancel: committed with the others of the moment
		// (return_batch.go), which work out where the units go.
		if err := checkParts(info, o, kv); err != nil {
			return nil, false, err
		}
		return e.commitReturn(ctx, &returnReq{info: info, o: o, kv: kv})
	}
	targets, err := e.returnTargets(info, o, kv)
	if err != nil {
		return nil, false, err
	}
	cmps, ops, userKey, err := e.returnOps(ctx, info, o, kv, targets)
	if errors.Is(err, errOrderChanged) {
		return nil, true, nil // returned, confirmed or expired meanwhile: read again
	}
	if err != nil {
		return nil, false, err
	}
	cmps = append(fence[:len(fence):len(fence)], cmps...)
	o.State = StateExpired
	ops = append(ops, clientv3.OpPut(string(kv.Key), EncodeOrder(o)))
	// As a rebalancer's move: never abandoned once sent.
	resp, err := e.commitMove(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	})
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

// returnVerdict says whether an order read at revision rev may be returned
// by kind now. When it may not, err is the answer (ErrConflict, an
// *ExpiredError, errNotDue), or nil for an order already released (the
// caller reports it as such).
func returnVerdict(kind returnKind, o Order, rev int64, now time.Time) (proceed bool, err error) {
	expired := &ExpiredError{SKU: o.SKU, Order: o.ID, Deadline: o.Deadline, Revision: rev}
	switch kind {
	case retRelease:
		if o.State == StateExpired {
			return false, expired
		}
		if o.Released {
			return false, nil
		}
	case retCancel:
		switch {
		case o.State == "":
			return false, fmt.Errorf("%w: the order is a plain allocation, not a reservation (use release)", ErrConflict)
		case o.State == StateConfirmed:
			return false, fmt.Errorf("%w: the reservation was confirmed; a paid order is returned by release", ErrConflict)
		case o.State == StateExpired:
			return false, expired
		case o.Released:
			return false, nil
		}
	case retExpire:
		if !o.Reserved() || now.Before(o.Deadline) {
			return false, errNotDue
		}
	}
	return true, nil
}

// returnTo is where an order's units go back: each counter key (a
// segment's inbox, or the pool) and how many, in the order first named.
type returnTo struct {
	keys []string
	give map[string]int64
}

func (t returnTo) has(key string) bool { _, ok := t.give[key]; return ok }

// returnSegment is the segment whose inbox a returned part goes to: the one
// the order's ID routes to, whichever place the part came from. Stock is
// fungible, and an inbox takes a deposit without a lock, so that returns
// never wait for (nor make a storm of orders wait for) the pool's lock;
// the rebalancer drains what a segment does not sell. Not the segment the
// part came from: a sold-out SKU's released units are sold again from the
// few segments that sell, and their releases came back to those few
// inboxes, each a read and a compared write, so that concurrent releases
// refused each other's writes (73 % of them in bench --sale's
// storm-release: docs/benchmarks.md, stop 46). Spread by order ID, they
// meet far less.
func returnSegment(order string, segments int) int {
	return Route(order, segments)
}

// checkParts reports a record (o, read as kv) naming a place its SKU does
// not have as corrupt.
func checkParts(info *skuInfo, o Order, kv *mvccpb.KeyValue) error {
	for _, p := range o.Parts {
		if p.Place.Index() >= info.segments {
			return &CorruptError{Key: string(kv.Key), Value: kv.Value,
				Err: fmt.Errorf("part from %v of a SKU with %d segments", p.Place, info.segments)}
		}
	}
	return nil
}

// returnTargets works out where o's parts go back to (returnSegment).
func (e *Engine) returnTargets(info *skuInfo, o Order, kv *mvccpb.KeyValue) (returnTo, error) {
	t := returnTo{give: map[string]int64{}}
	if err := checkParts(info, o, kv); err != nil {
		return t, err
	}
	key := e.keys.Inbox(info.name, returnSegment(o.ID, info.segments))
	for _, p := range o.Parts {
		if !t.has(key) {
			t.keys = append(t.keys, key)
		}
		t.give[key] += p.Qty
	}
	return t, nil
}

// errOrderChanged is returnOps's answer when the order record is no
// longer at the revision its caller read: another call returned, confirmed
// or expired it in between. The caller reads the order again; nothing was
// written.
var errOrderChanged = errors.New("order record changed since it was read")

// returnOps reads the counters a return of o changes and builds its
// compares (the order record's revision, each counter's) and writes (the
// counters, the buyer's counter, the reservation's index key); the order
// record's own write is the caller's. userKey is the buyer's counter, when
// the order was counted there.
//
// The counters are read together with the order record, at one revision.
// The record was read in an earlier round trip, and a return committed in
// between (a retried webhook's second Release, the sweep and a late
// Confirm) takes the order's units off the buyer's counter: read alone, the
// counter would look too small for the order, which is not corruption but
// a changed order. So the counters are judged only when the record is still
// at kv's revision; otherwise the answer is errOrderChanged. A counter
// inconsistent with an unchanged record, at one revision, is ErrCorrupt.
func (e *Engine) returnOps(ctx context.Context, info *skuInfo, o Order, kv *mvccpb.KeyValue, t returnTo) (cmps []clientv3.Cmp, ops []clientv3.Op, userKey string, err error) {
	reads := make([]clientv3.Op, len(t.keys), len(t.keys)+2)
	for i, key := range t.keys {
		reads[i] = clientv3.OpGet(key)
	}
	if o.UserCounted {
		userKey = e.keys.User(info.name, o.Buyer)
		reads = append(reads, clientv3.OpGet(userKey))
	}
	reads = append(reads, clientv3.OpGet(string(kv.Key), clientv3.WithKeysOnly()))
	cur, err := e.kv.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		return nil, nil, "", err
	}
	if rec := cur.Responses[len(reads)-1].GetResponseRange().GetKvs(); len(rec) == 0 || rec[0].ModRevision != kv.ModRevision {
		return nil, nil, "", errOrderChanged
	}
	cmps = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)}
	for i, key := range t.keys {
		v, mod, err := decodeCounterKV(key, cur.Responses[i].GetResponseRange())
		if err != nil {
			return nil, nil, "", err
		}
		if v+t.give[key] > MaxTotal {
			return nil, nil, "", fmt.Errorf("%w: returning %d to %s would exceed the maximum", ErrCorrupt, t.give[key], key)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", mod))
		ops = append(ops, clientv3.OpPut(key, EncodeCounter(v+t.give[key])))
	}
	if userKey != "" {
		v, mod, err := decodeCounterKV(userKey, cur.Responses[len(t.keys)].GetResponseRange())
		if err != nil {
			return nil, nil, "", err
		}
		if v < o.Qty {
			return nil, nil, "", fmt.Errorf("%w: buyer counter %s holds %d, less than order %q's %d (both read at revision %d)",
				ErrCorrupt, userKey, v, o.ID, o.Qty, cur.Header.Revision)
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
	return cmps, ops, userKey, nil
}

// returnBackoff waits before attempt+1 of a return whose compares failed: a
// random pause, doubling with each attempt (at most 64 ms), so that returns
// to one segment's inbox from many callers at once (releases, cancels) do
// not keep failing each other's compares in lockstep. It returns ctx's
// cause if ctx ends first.
func returnBackoff(ctx context.Context, attempt int) error {
	d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
	if !background.Sleep(ctx, d) {
		return context.Cause(ctx)
	}
	return nil
}
