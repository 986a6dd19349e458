package segments

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Batched expiry. Expiring reservations one transaction each costs three
// round trips per reservation; in a busy sale (hundreds of reservations
// expiring a second on two cores) the sweep then falls behind its 1 s
// target. So ExpireDue first reads every due order in one transaction and
// expires as many as fit in one transaction together: the same compares as
// one at a time (the fence, each order's revision, each inbox and buyer
// counter it adds to or takes from), one commit for all. If any compare
// fails (a Confirm won a race, a seller absorbed an inbox meanwhile), the
// chunk falls back to one transaction per reservation, which sorts out who
// won. A chunk's units all go back to one inbox: the one its first order's
// ID routes to (returnSegment; one at a time, each order's own). Sent to
// each order's own inbox, a chunk of ~37 orders compared ~20 inboxes, and
// in a busy sale a seller absorbed one of them between the chunk's read and
// its commit more often than not: in demo --checkout most chunks failed
// twice and went one at a time, and reservations expired 0.4-0.9 s after
// their deadline (p50) instead of 46 ms (docs/benchmarks.md, stop 47).
// Stock is fungible, chunks start at different orders, and the rebalancer
// drains what a segment does not sell.

// dueOrder is a due reservation read for a batched expiry.
type dueOrder struct {
	indexKey string
	o        Order
	kv       *mvccpb.KeyValue
}

// readDue reads the orders of due index keys in transactions of at most
// maxTxnOps reads, and sorts them: those a batch can expire, and the rest
// (gone, not live, not due) for one at a time.
func (e *Engine) readDue(ctx context.Context, info *skuInfo, todo []due, now time.Time) (batch []dueOrder, single []due, err error) {
	for len(todo) > 0 {
		chunk := todo[:min(len(todo), e.cfg.MaxTxnOps)]
		todo = todo[len(chunk):]
		reads := make([]clientv3.Op, len(chunk))
		for i, d := range chunk {
			reads[i] = clientv3.OpGet(e.keys.Order(info.name, d.order))
		}
		resp, err := e.kv.Txn(ctx).Then(reads...).Commit()
		if err != nil {
			return nil, nil, err
		}
		for i, d := range chunk {
			kvs := resp.Responses[i].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				single = append(single, d)
				continue
			}
			o, err := DecodeOrder(string(kvs[0].Key), kvs[0].Value)
			if err != nil {
				return nil, nil, err
			}
			// A line of an order of several goes one at a time: its
			// expiry takes every line (cartreturn.go).
			ok := o.Lines == nil && o.Reserved() && !now.Before(o.Deadline) && o.SKU == info.name && o.ID == d.order &&
				e.keys.Reservation(info.name, o.Deadline.UnixNano(), o.ID) == d.key &&
				checkParts(info, o, kvs[0]) == nil // a corrupt one is reported one at a time
			if ok {
				batch = append(batch, dueOrder{indexKey: d.key, o: o, kv: kvs[0]})
			} else {
				single = append(single, d)
			}
		}
	}
	return batch, single, nil
}

// expireBatch expires batch in chunks that fit one transaction; what a
// failed chunk holds is returned for one at a time.
func (e *Engine) expireBatch(ctx context.Context, info *skuInfo, batch []dueOrder, fence []clientv3.Cmp) ([]Expiry, []due, error) {
	var out []Expiry
	var left []due
	limit := e.cfg.MaxTxnOps
	for len(batch) > 0 {
		// Greedy: orders in deadline order while the compares, the writes
		// and the reads of the counters they touch fit.
		cmps, ops, reads := len(fence), 0, 0
		users := map[string]bool{}
		inboxCounted := false // the chunk's parts all go back to one inbox
		n := 0
		for ; n < len(batch); n++ {
			o := batch[n].o
			dc, do, dr := 1, 2, 1 // its record: compared, written, read again
			newInbox := len(o.Parts) > 0 && !inboxCounted
			if newInbox {
				dc, do, dr = dc+1, do+1, dr+1
			}
			user := ""
			if o.UserCounted {
				if k := e.keys.User(info.name, o.Buyer); !users[k] {
					user = k
					dc, do, dr = dc+1, do+1, dr+1
				}
			}
			if n > 0 && (cmps+dc > limit || ops+do > limit || reads+dr > limit) {
				break
			}
			cmps, ops, reads = cmps+dc, ops+do, reads+dr
			inboxCounted = inboxCounted || newInbox
			if user != "" {
				users[user] = true
			}
		}
		chunk := batch[:n]
		batch = batch[n:]
		xs, ok, err := e.expireChunk(ctx, info, chunk, fence)
		if err != nil {
			return out, nil, err
		}
		out = append(out, xs...)
		if !ok {
			for _, d := range chunk {
				left = append(left, due{key: d.indexKey, order: d.o.ID})
			}
		}
	}
	return out, left, nil
}

// chunkInbox is the inbox every unit of a chunk of expiries starting at
// chunk[0] goes back to: the one its first order's ID routes to.
func (e *Engine) chunkInbox(info *skuInfo, chunk []dueOrder) string {
	return e.keys.Inbox(info.name, returnSegment(chunk[0].o.ID, info.segments))
}

// expireChunk expires chunk in one transaction; ok false means a record
// changed since it was read or a compare failed (nothing changed), and the
// fence still holds.
func (e *Engine) expireChunk(ctx context.Context, info *skuInfo, chunk []dueOrder, fence []clientv3.Cmp) ([]Expiry, bool, error) {
	give := map[string]int64{}
	take := map[string]int64{}
	var counters []string // the inbox, then buyers
	inbox := e.chunkInbox(info, chunk)
	for _, d := range chunk {
		for _, p := range d.o.Parts {
			give[inbox] += p.Qty
		}
	}
	if _, ok := give[inbox]; ok {
		counters = append(counters, inbox)
	}
	for _, d := range chunk {
		if d.o.UserCounted {
			k := e.keys.User(info.name, d.o.Buyer)
			if _, ok := take[k]; !ok {
				counters = append(counters, k)
			}
			take[k] += d.o.Qty
		}
	}
	// The counters are read with the order records, at one revision: a
	// record changed since readDue (a late Confirm expired it, a Cancel
	// returned it) has already taken its units off its buyer's counter,
	// which would then look too small for the chunk. Such a chunk goes back
	// for one at a time, like one whose commit failed; only a counter
	// inconsistent with unchanged records is corrupt.
	reads := make([]clientv3.Op, 0, len(counters)+len(chunk))
	for _, k := range counters {
		reads = append(reads, clientv3.OpGet(k))
	}
	for _, d := range chunk {
		reads = append(reads, clientv3.OpGet(string(d.kv.Key), clientv3.WithKeysOnly()))
	}
	cur, err := e.kv.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		return nil, false, err
	}
	for i, d := range chunk {
		rec := cur.Responses[len(counters)+i].GetResponseRange().GetKvs()
		if len(rec) == 0 || rec[0].ModRevision != d.kv.ModRevision {
			return nil, false, nil
		}
	}
	cmps := append([]clientv3.Cmp(nil), fence...)
	var ops []clientv3.Op
	for i, k := range counters {
		v, mod, err := decodeCounterKV(k, cur.Responses[i].GetResponseRange())
		if err != nil {
			return nil, false, err
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", mod))
		switch q, isUser := take[k]; {
		case isUser && v < q:
			return nil, false, fmt.Errorf("%w: buyer counter %s holds %d, less than its expiring reservations' %d (read at revision %d)",
				ErrCorrupt, k, v, q, cur.Header.Revision)
		case isUser && v == q:
			ops = append(ops, clientv3.OpDelete(k))
		case isUser:
			ops = append(ops, clientv3.OpPut(k, EncodeCounter(v-q)))
		case v+give[k] > MaxTotal:
			return nil, false, fmt.Errorf("%w: returning %d to %s would exceed the maximum", ErrCorrupt, give[k], k)
		default:
			ops = append(ops, clientv3.OpPut(k, EncodeCounter(v+give[k])))
		}
	}
	for _, d := range chunk {
		o := d.o
		o.State = StateExpired
		key := string(d.kv.Key)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", d.kv.ModRevision))
		ops = append(ops, clientv3.OpPut(key, EncodeOrder(o)), clientv3.OpDelete(d.indexKey))
	}
	resp, err := e.commitMove(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	})
	for k := range take {
		e.users.forget(k)
	}
	if err != nil {
		return nil, false, err
	}
	if !resp.Succeeded {
		if err := e.checkFence(ctx, fence); err != nil {
			return nil, false, err
		}
		return nil, false, nil
	}
	at := time.Now()
	out := make([]Expiry, len(chunk))
	for i, d := range chunk {
		out[i] = Expiry{SKU: info.name, Order: d.o.ID, Qty: d.o.Qty, Buyer: d.o.Buyer, Deadline: d.o.Deadline,
			Revision: resp.Header.Revision, At: at}
	}
	return out, true, nil
}
