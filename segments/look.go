package segments

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Looks. When the segments this process holds cannot serve an order, the
// order looks at its whole SKU: every counter and inbox, and whether its
// order ID was used meanwhile, at one revision. That revision must be no
// older than the order's start, so that a refusal made from it is true then
// (a release, an expiry or a restock committed before the order began is
// seen): it is a linearizable read sent after the order arrived.
//
// A look costs one read, and in a sold-out storm every order needs one. So
// looks are shared, the way commits are: the orders of this process that
// need a look at the same moment, of any SKU, are answered by one etcd
// transaction (one range per SKU, one Get per order ID), sent after every
// one of them arrived. Up to lookParallel such reads are in flight at once;
// an order that arrives while they are waits for the next.

// lookParallel is how many shared look reads may be in flight at once: one
// more than one, so that an order arriving during a read waits for at most
// about one read, not two.
const lookParallel = 2

// lookReq is one order's look, or its peek at one segment (pk set).
type lookReq struct {
	sku   *skuInfo
	order string // "" when no replay check is wanted
	done  chan struct{}
	snap  *snapshot        // shared by the orders of one read and SKU: read-only
	claim *mvccpb.KeyValue // the order ID's claim, when it was used
	err   error
	pk    *peekRead // a peek's segment and what it found; nil: a look
}

// peekRead is a peek's segment, where its reads are in the look
// transaction, and what they found.
type peekRead struct {
	seg, at int
	found   peek
}

// peek is one segment as a peek read it, at one revision: its counter,
// inbox, and whether its lock has a key (a holder or a waiter).
type peek struct {
	ctr SegmentCounter
	// cntMod and cntCreate are the counter's ModRevision and
	// CreateRevision (0: no counter); peekInto verifies the SKU's
	// incarnation by the latter.
	cntMod, cntCreate int64
	inbox, inMod      int64
	locked            bool
}

// peekOps is what a peek costs a look transaction: the counter, the inbox
// and a count of the lock's keys.
const peekOps = 3

// peekAt reads segment i of sku as a peek (no replay check, no other
// segment), sharing the transaction with the looks and peeks of the moment.
// A first order of a SKU in this process that may be sold directly peeks
// at the segment it would sell from, rather than look at the whole SKU (a
// range over every counter and inbox, which etcd must read and send: most
// of the CPU of an order over thousands of SKUs, each order the first of
// its SKU in its process). The sale is fenced by its commit as always; a
// peek that finds the segment unable to sell sends the order on to a look.
func (e *Engine) peekAt(ctx context.Context, sku *skuInfo, i int) (peek, error) {
	r := &lookReq{sku: sku, pk: &peekRead{seg: i}, done: make(chan struct{})}
	e.looks.Submit(r)
	select {
	case <-r.done:
		return r.pk.found, r.err
	case <-ctx.Done():
		return peek{}, context.Cause(ctx)
	}
}

// look reads sku's stock, and the claim of order (unless ""), at a
// revision no older than the call, sharing the read with the other orders
// of this process that look at the same moment. ctx bounds the wait.
func (e *Engine) look(ctx context.Context, sku *skuInfo, order string) (*snapshot, *mvccpb.KeyValue, error) {
	r := &lookReq{sku: sku, order: order, done: make(chan struct{})}
	e.looks.Submit(r)
	select {
	case <-r.done:
		return r.snap, r.claim, r.err
	case <-ctx.Done():
		return nil, nil, context.Cause(ctx)
	}
}

// selectLooks takes the oldest looks that fit one transaction: a range, a
// meta read and maybe a read of records (lookBase) per distinct SKU and a
// Get per order ID count against max-txn-ops.
func (e *Engine) selectLooks(queue []*lookReq) (batch, rest []*lookReq) {
	skus := map[string]bool{}
	ops := 0
	rest = queue[:0]
	for _, r := range queue {
		n := 0
		if r.pk != nil {
			n = peekOps
		} else if !skus[r.sku.name] {
			n += 3 // its stock, its meta, and maybe the records since its lazy base
		}
		if r.order != "" {
			n++
		}
		if len(batch) > 0 && ops+n > e.cfg.MaxTxnOps {
			rest = append(rest, r)
			continue
		}
		ops += n
		if r.pk == nil {
			skus[r.sku.name] = true
		}
		batch = append(batch, r)
	}
	return batch, rest
}

// readLooks answers a batch of looks with one transaction (the batcher's
// Commit). A read that fails answers every look of it with the error.
func (e *Engine) readLooks(bg context.Context, batch []*lookReq) {
	ctx, cancel := context.WithTimeout(bg, e.cfg.CommitTimeout)
	defer cancel()
	var ops []clientv3.Op
	var skus []*skuInfo // in the order of their ranges in ops
	seen := map[string]bool{}
	for _, r := range batch {
		if r.pk == nil && !seen[r.sku.name] {
			seen[r.sku.name] = true
			skus = append(skus, r.sku)
			ops = append(ops, clientv3.OpGet(e.keys.SKUStock(r.sku.name), clientv3.WithPrefix()))
		}
	}
	for _, r := range batch {
		if r.pk == nil && r.order != "" {
			ops = append(ops, clientv3.OpGet(e.keys.Order(r.sku.name, r.order)))
		}
	}
	// Each SKU's meta record, keys only: a SKU deleted (or deleted and
	// created again) since this process read it is answered as such, not
	// from a view of counters it no longer has.
	metaAt := len(ops)
	for _, info := range skus {
		ops = append(ops, clientv3.OpGet(e.keys.Meta(info.name), clientv3.WithKeysOnly()))
	}
	// A SKU whose last look, a moment ago, found lazy segments most
	// likely has them still: the records since their oldest base then,
	// read at this transaction's revision, count what they sold without a
	// second round trip (settleLooks).
	spec := map[*skuInfo]specRead{}
	now := time.Now().UnixNano()
	for _, info := range skus {
		if base := info.lookBase.Load(); base > 0 && now-info.lookBaseAt.Load() < int64(lookBaseFresh) {
			spec[info] = specRead{at: len(ops), base: base}
			ops = append(ops, clientv3.OpGet(e.keys.Orders(info.name), clientv3.WithPrefix(),
				clientv3.WithMinCreateRev(base+1), clientv3.WithLimit(specReadLimit())))
		}
	}
	for _, r := range batch {
		if pk := r.pk; pk != nil {
			pk.at = len(ops)
			ops = append(ops, clientv3.OpGet(e.keys.Segment(r.sku.name, pk.seg)), clientv3.OpGet(e.keys.Inbox(r.sku.name, pk.seg)),
				clientv3.OpGet(e.keys.SegmentLock(r.sku.name, pk.seg), clientv3.WithPrefix(), clientv3.WithCountOnly()))
		}
	}
	resp, err := e.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		for _, r := range batch {
			r.err = fmt.Errorf("read stock: %w", err)
			close(r.done)
		}
		return
	}
	snaps := make(map[string]*snapshot, len(skus))
	errs := map[string]error{}
	for i, info := range skus {
		if kvs := resp.Responses[metaAt+i].GetResponseRange().GetKvs(); info.created != 0 &&
			(len(kvs) == 0 || kvs[0].CreateRevision != info.created) {
			e.forgetSKU(info)
			errs[info.name] = skuGoneErr(info, len(kvs) == 0)
			continue
		}
		snaps[info.name], errs[info.name] = e.decodeSnapshot(info, resp.Header.Revision, resp.Responses[i].GetResponseRange().Kvs)
		if snap := snaps[info.name]; snap != nil && info.created != 0 {
			snap.verified = info.created
		}
	}
	for info, sr := range spec {
		rr := resp.Responses[sr.at].GetResponseRange()
		e.lookRecords.Add(int64(len(rr.GetKvs())))
		if rr.GetMore() || int64(len(rr.GetKvs())) >= specReadLimit() {
			// Cut short: not every record since the base. A lazy
			// segment that old is stale; a second read counts it.
			delete(spec, info)
			continue
		}
		sr.kvs = rr.GetKvs()
		spec[info] = sr
	}
	e.settleLooks(ctx, skus, snaps, errs, spec)
	next := len(skus)
	for _, r := range batch {
		if pk := r.pk; pk != nil {
			pk.found, r.err = decodePeek(resp.Responses[pk.at:pk.at+peekOps], e.keys.Inbox(r.sku.name, pk.seg))
			e.peeksRead.Add(1)
			close(r.done)
			continue
		}
		e.looksRead.Add(1)
		r.snap, r.err = snaps[r.sku.name], errs[r.sku.name]
		if r.order != "" {
			if kvs := resp.Responses[next].GetResponseRange().Kvs; len(kvs) > 0 {
				r.claim = kvs[0]
			}
			next++
		}
		close(r.done)
	}
}

// decodePeek decodes a peek's reads (readLooks), the inbox's under inKey:
// a missing counter or inbox is 0 at revision 0.
func decodePeek(rs []*pb.ResponseOp, inKey string) (p peek, err error) {
	if kvs := rs[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		if p.ctr, err = DecodeSegmentCounter(string(kvs[0].Key), kvs[0].Value); err != nil {
			return p, err
		}
		p.cntMod, p.cntCreate = kvs[0].ModRevision, kvs[0].CreateRevision
	}
	if p.inbox, p.inMod, err = decodeCounterKV(inKey, rs[1].GetResponseRange()); err != nil {
		return p, err
	}
	p.locked = rs[2].GetResponseRange().GetCount() > 0
	return p, nil
}

// lookBaseFresh is how long after a look that found lazy segments of a SKU
// its next look reads the records since their oldest base speculatively,
// in its own transaction. etcd answers a read of the records since a
// revision by reading every record of the SKU and dropping the older ones
// (its revision filters apply after the range), so a base remembered
// from a look long ago, on a SKU whose lazy segments have been settled
// since, returned the whole sale since then: 140,000 records a look of a
// SKU sold for 20 seconds (docs/benchmarks.md, stop 50).
const lookBaseFresh = time.Second

// specReadLimit bounds the records a speculative read returns: more than
// staleLazyRecords since a base mean a stale lazy segment, which a second
// read counts (and settleStale settles), or none left at all.
func specReadLimit() int64 { return int64(staleLazyRecords) + 1 }

// specRead is a look's read of a SKU's records since the oldest lazy base
// its last look found (lookBase): at index at of the look's transaction.
type specRead struct {
	at   int
	base int64
	kvs  []*mvccpb.KeyValue
}

// settleLooks subtracts the unsettled sales of the snapshots' lazy
// segments: from the look's own read of the records since a base (spec)
// when that base is no later than every lazy segment's, else reading every
// other SKU's in one more transaction at the snapshots' revision. A SKU
// whose read fails gets the error. Each SKU's lookBase becomes the oldest
// base its snapshot found, or 0.
func (e *Engine) settleLooks(ctx context.Context, skus []*skuInfo, snaps map[string]*snapshot, errs map[string]error, spec map[*skuInfo]specRead) {
	var ops []clientv3.Op
	var lazy []*skuInfo
	for _, info := range skus {
		s := snaps[info.name]
		if errs[info.name] != nil || len(s.lazy) == 0 {
			if errs[info.name] == nil {
				info.lookBase.Store(0)
			}
			continue
		}
		oldest := s.lazy[0].base
		for _, l := range s.lazy[1:] {
			oldest = min(oldest, l.base)
		}
		info.lookBase.Store(oldest)
		info.lookBaseAt.Store(time.Now().UnixNano())
		if sr, ok := spec[info]; ok && sr.base <= oldest {
			// The records since sr.base, at the snapshot's revision, hold
			// every record since each lazy segment's base.
			e.settleLook(info, s, sr.kvs, errs)
			continue
		}
		ops = append(ops, e.unsettledRead(info.name, s.rev, s.lazy))
		lazy = append(lazy, info)
	}
	if len(ops) == 0 {
		return
	}
	e.lookRereads.Add(int64(len(lazy)))
	resp, err := e.kv.Txn(ctx).Then(ops...).Commit()
	for i, info := range lazy {
		if err != nil {
			errs[info.name] = fmt.Errorf("read the unsettled orders of %s: %w", info.name, err)
			continue
		}
		kvs := resp.Responses[i].GetResponseRange().GetKvs()
		e.lookRecords.Add(int64(len(kvs)))
		e.settleLook(info, snaps[info.name], kvs, errs)
	}
}

// settleLook subtracts from s the sales of its lazy segments in kvs, the
// SKU's records since (at least) their oldest base at s's revision, and
// has the stale ones settled (settleStale).
func (e *Engine) settleLook(info *skuInfo, s *snapshot, kvs []*mvccpb.KeyValue, errs map[string]error) {
	sold, err := unsettledSales(info.name, s.lazy, kvs)
	if err != nil {
		errs[info.name] = err
		return
	}
	e.settleStale(info, staleLazy(s.lazy, kvs))
	s.settleLazy(sold)
}
