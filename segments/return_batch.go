package segments

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Returns committed together. A Release or a Cancel reads its order, then
// hands the return to the returner, which commits every return waiting at
// that moment in one transaction, as the committer does orders and the
// confirmer Confirms: one read of the counters they add to (and of their
// records, keys only, at the same revision), one commit comparing each
// record's revision and each counter's. One at a time, the returns of a
// busy sale met on the inboxes they add to (a read, then a compared write,
// each), and refused each other's writes: in bench --sale's storm-release,
// where the buyers served by one commit release at the same moment, 45-52 %
// of release transactions were refused and sent again after a pause
// (docs/benchmarks.md, stop 46).
//
// Every unit of a SKU's returns in one transaction goes to one inbox: the
// one its first return's order ID routes to (returnSegment), as a chunk of
// expiries does (expire_batch.go); a return alone goes to its own order's.
// A return whose record changed between its Release's read and the
// transaction (another Release, a Cancel, the sweep) is answered "read
// again", as one alone is; when only counters moved (a seller absorbed an
// inbox, another process returned to it), the returner reads them again and
// commits again, up to returnBatchAttempts times, before it answers "read
// again" too. The sweep's expiries and the returns of an order's several
// lines keep their own transactions (expire_batch.go, cartreturn.go).

// returnReq is one Release or Cancel handed to the returner: an order read
// at kv's revision that returnVerdict said it may return.
type returnReq struct {
	info *skuInfo
	o    Order
	kv   *mvccpb.KeyValue
	done chan struct{}
	// The answer: the return, or retry (the record changed, or the
	// counters kept moving: read again), or err.
	r     *Released
	retry bool
	err   error
}

func (r *returnReq) answer(out *Released, retry bool, err error) {
	r.r, r.retry, r.err = out, retry, err
	close(r.done)
}

// returnBatchAttempts bounds the transactions the returner sends for one
// batch whose records did not change: each attempt reads the counters again.
const returnBatchAttempts = 3

// commitReturn returns r's order through the returner: the order's units
// go back and its record is marked (released) in a transaction shared with
// the other returns of the moment. retry means read the order again.
func (e *Engine) commitReturn(ctx context.Context, r *returnReq) (*Released, bool, error) {
	r.done = make(chan struct{})
	e.returns.Submit(r)
	select {
	case <-r.done:
		return r.r, r.retry, r.err
	case <-ctx.Done():
		return nil, false, fmt.Errorf("%w (the return was handed to a commit that may still land: return it again to learn its outcome)", context.Cause(ctx))
	}
}

// returnPlan is where a batch of returns goes: per SKU the inbox its units
// go to, what each counter gains (inboxes) or loses (buyers' counters), in
// the order first named.
type returnPlan struct {
	inbox    map[string]string // SKU → inbox key
	counters []string
	give     map[string]int64 // inbox → units returned
	take     map[string]int64 // buyer counter → units taken off
}

// planReturns works out batch's counters (returnPlan).
func (e *Engine) planReturns(batch []*returnReq) returnPlan {
	p := returnPlan{inbox: map[string]string{}, give: map[string]int64{}, take: map[string]int64{}}
	for _, r := range batch {
		sku := r.info.name
		inbox, ok := p.inbox[sku]
		if !ok {
			inbox = e.keys.Inbox(sku, returnSegment(r.o.ID, r.info.segments))
			p.inbox[sku] = inbox
		}
		for _, part := range r.o.Parts {
			if _, ok := p.give[inbox]; !ok {
				p.counters = append(p.counters, inbox)
			}
			p.give[inbox] += part.Qty
		}
		if r.o.UserCounted {
			k := e.keys.User(sku, r.o.Buyer)
			if _, ok := p.take[k]; !ok {
				p.counters = append(p.counters, k)
			}
			p.take[k] += r.o.Qty
		}
	}
	return p
}

// selectReturns takes the oldest waiting returns whose compares, writes and
// reads fit one transaction (a record's compare, write and read, an index
// key's delete, and each counter once), never two of one record (the later
// waits for the next transaction, and finds the order returned). It is the
// returner's Select.
func (e *Engine) selectReturns(queue []*returnReq) (batch, rest []*returnReq) {
	limit := e.cfg.MaxTxnOps
	records := map[string]bool{}
	counters := map[string]bool{}
	cmps, ops, reads := 0, 0, 0
	rest = queue[:0]
	for _, r := range queue {
		key := string(r.kv.Key)
		var add []string // counters r would add: a SKU's one inbox, its buyer's
		if len(r.o.Parts) > 0 && !counters["inbox of "+r.info.name] {
			add = append(add, "inbox of "+r.info.name)
		}
		if r.o.UserCounted && !counters[e.keys.User(r.info.name, r.o.Buyer)] {
			add = append(add, e.keys.User(r.info.name, r.o.Buyer))
		}
		dc, do, dr := 1+len(add), 1+len(add), 1+len(add)
		if r.o.State == StateReserved {
			do++
		}
		if records[key] || (len(batch) > 0 && (cmps+dc > limit || ops+do > limit || reads+dr > limit)) {
			rest = append(rest, r)
			continue
		}
		records[key] = true
		for _, k := range add {
			counters[k] = true
		}
		cmps, ops, reads = cmps+dc, ops+do, reads+dr
		batch = append(batch, r)
	}
	return batch, rest
}

// commitReturns commits batch, or answers each return of it. It is the
// returner's Commit.
func (e *Engine) commitReturns(bg context.Context, batch []*returnReq) {
	ctx, cancel := context.WithTimeout(bg, e.cfg.CommitTimeout)
	defer cancel()
	for attempt := 1; len(batch) > 0; attempt++ {
		batch = e.commitReturnsOnce(ctx, batch, attempt)
	}
}

// commitReturnsOnce reads batch's counters and records, answers the returns
// whose record changed or whose counters are corrupt, and commits the
// rest. It returns what to send again: the returns of a refused commit
// whose records did not change, while attempt is below returnBatchAttempts.
func (e *Engine) commitReturnsOnce(ctx context.Context, batch []*returnReq, attempt int) []*returnReq {
	p := e.planReturns(batch)
	// The counters are read with the records, at one revision: a record
	// changed since its Release read it (another return took its units off
	// its buyer's counter, which would look too small) is answered "read
	// again", and only a counter inconsistent with unchanged records is
	// corrupt (returnOps says the same of one return).
	reads := make([]clientv3.Op, 0, len(p.counters)+len(batch))
	for _, k := range p.counters {
		reads = append(reads, clientv3.OpGet(k))
	}
	for _, r := range batch {
		reads = append(reads, clientv3.OpGet(string(r.kv.Key), clientv3.WithKeysOnly()))
	}
	cur, err := e.kv.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		for _, r := range batch {
			r.answer(nil, false, err)
		}
		return nil
	}
	keep := batch[:0:0]
	for i, r := range batch {
		if rec := cur.Responses[len(p.counters)+i].GetResponseRange().GetKvs(); len(rec) == 0 || rec[0].ModRevision != r.kv.ModRevision {
			r.answer(nil, true, nil)
			continue
		}
		keep = append(keep, r)
	}
	if len(keep) < len(batch) {
		return keep // planned again without them
	}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for i, k := range p.counters {
		v, mod, err := decodeCounterKV(k, cur.Responses[i].GetResponseRange())
		switch q, isUser := p.take[k]; {
		case err != nil:
		case isUser && v < q:
			err = fmt.Errorf("%w: buyer counter %s holds %d, less than its returned orders' %d (read at revision %d with the orders)",
				ErrCorrupt, k, v, q, cur.Header.Revision)
		case isUser && v == q:
			ops = append(ops, clientv3.OpDelete(k))
		case isUser:
			ops = append(ops, clientv3.OpPut(k, EncodeCounter(v-q)))
		case v+p.give[k] > MaxTotal:
			err = fmt.Errorf("%w: returning %d to %s would exceed the maximum", ErrCorrupt, p.give[k], k)
		default:
			ops = append(ops, clientv3.OpPut(k, EncodeCounter(v+p.give[k])))
		}
		if err != nil {
			// Answer the returns that touch k; the others go on.
			return e.failTouching(batch, k, err)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", mod))
	}
	diag := make([]clientv3.Op, 0, len(batch))
	for _, r := range batch {
		o := r.o
		o.Released = true
		key := string(r.kv.Key)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", r.kv.ModRevision))
		ops = append(ops, clientv3.OpPut(key, EncodeOrder(o)))
		if o.State == StateReserved {
			ops = append(ops, clientv3.OpDelete(e.keys.Reservation(r.info.name, o.Deadline.UnixNano(), o.ID)))
		}
		diag = append(diag, clientv3.OpGet(key, clientv3.WithKeysOnly()))
	}
	resp, err := e.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
	for k := range p.take {
		e.users.forget(k) // the committer reads it again
	}
	switch {
	case err != nil:
		for _, r := range batch {
			r.answer(nil, false, err)
		}
		return nil
	case resp.Succeeded:
		for _, r := range batch {
			r.answer(&Released{SKU: r.o.SKU, Order: r.o.ID, Qty: r.o.Qty, Parts: r.o.Parts, Released: true,
				Revision: resp.Header.Revision, State: r.o.State, Buyer: r.o.Buyer}, false, nil)
		}
		return nil
	}
	// Refused: the returns whose record changed read again; the others are
	// sent again with their counters read again, a few times.
	keep = batch[:0:0]
	for i, r := range batch {
		kvs := resp.Responses[i].GetResponseRange().GetKvs()
		if len(kvs) == 0 || kvs[0].ModRevision != r.kv.ModRevision || attempt >= returnBatchAttempts {
			r.answer(nil, true, nil)
			continue
		}
		keep = append(keep, r)
	}
	return keep
}

// failTouching answers with err every return of batch that adds to or
// takes from counter, and returns the others.
func (e *Engine) failTouching(batch []*returnReq, counter string, err error) []*returnReq {
	p := e.planReturns(batch)
	keep := batch[:0:0]
	for _, r := range batch {
		touches := (len(r.o.Parts) > 0 && p.inbox[r.info.name] == counter) ||
			(r.o.UserCounted && e.keys.User(r.info.name, r.o.Buyer) == counter)
		if touches {
			r.answer(nil, false, err)
			continue
		}
		keep = append(keep, r)
	}
	return keep
}
