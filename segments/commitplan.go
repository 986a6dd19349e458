package segments

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/lock"
)

// Per order, a transaction needs one compare (its record absent) and one
// put (the record, which is its ID's claim); per place two compares (the
// lock's key, the counter's revision) and one put (the counter). Inboxes
// are absorbed apart (absorb.go). What a refused transaction's groups read
// to learn why is read apart too, in as many transactions as it needs
// (readRefused): it does not bound a batch.
const (
	orderCmps, orderPuts = 1, 1
)

// opCost is what one place costs a transaction: compares and puts (etcd's
// --max-txn-ops bounds each).
type opCost struct{ cmps, puts int }

// heldPlaceCost is a held place's (committer.go); a direct place costs more
// (directPlaceCost), or less when it is lean (leanPlaceCost).
var heldPlaceCost = opCost{cmps: 2, puts: 1}

// selectOrders takes the oldest requests of queue that fit one transaction
// (etcd's --max-txn-ops, limit, bounds compares and puts separately). Two
// requests for one order ID never share a batch (the transaction would put
// its keys twice): the later one waits for the next, where it finds the ID
// used. Requests for which busy is true stay queued. The first request
// taken always goes, whatever its size. Each distinct place costs place,
// or leanPlaceCost while every part of the batch there is lean.
//
// What a place costs is known only once the batch is planned (a direct
// place's plan may absorb its inbox or write its counter); a lean part's
// cost is what its place's cache said when it was reserved, and
// commitOnce plans the batch again smaller in the rare case it no longer
// fits (fitsOneTxn). full reports that a request was left for want of
// room (not for conflicting with a commit in flight).
func selectOrders(queue []*commitReq, limit int, place opCost, busy func(*commitReq) bool) (batch, rest []*commitReq, full bool) {
	var cmps, puts int
	places := map[*placeState]opCost{} // what each place of the batch is charged
	var charged []placeCharge          // what the request at hand adds to it
	orders := map[string]bool{}
	users := map[string]bool{}
	skus := map[*skuInfo]bool{}
	rest = queue[:0]
	for _, cr := range queue {
		if full || orders[cr.req.order] || (busy != nil && busy(cr)) {
			rest = append(rest, cr)
			continue
		}
		nc, np := orderCmps, orderPuts
		if cr.req.ttl > 0 {
			np++ // the reservation's index key
		}
		newUser := cr.req.userKey != "" && !users[cr.req.userKey]
		if newUser {
			nc, np = nc+1, np+1 // the buyer's counter
		}
		// The SKU's incarnation, unless the order's places fence it
		// (lean ones do; the first order of the SKU that does not is
		// charged).
		newSKU := cr.req.sku.created != 0 && !skus[cr.req.sku] && !allLean(cr.parts)
		if newSKU {
			nc++
		}
		charged = charged[:0]
		for _, p := range cr.parts {
			cost := place
			if p.lean {
				cost = leanPlaceCost
			}
			was, ok := places[p.st]
			at := slices.IndexFunc(charged, func(c placeCharge) bool { return c.st == p.st })
			if at >= 0 {
				was, ok = charged[at].cost, true
			}
			if ok && was.cmps >= cost.cmps && was.puts >= cost.puts {
				continue
			}
			// New to the batch, or no longer lean: charge the difference.
			nc, np = nc+cost.cmps-was.cmps, np+cost.puts-was.puts
			c := placeCharge{p.st, opCost{max(cost.cmps, was.cmps), max(cost.puts, was.puts)}}
			if at >= 0 {
				charged[at] = c
			} else {
				charged = append(charged, c)
			}
		}
		if len(batch) > 0 && (cmps+nc > limit || puts+np > limit) {
			full = true
			rest = append(rest, cr)
			continue
		}
		cmps, puts = cmps+nc, puts+np
		for _, c := range charged {
			places[c.st] = c.cost
		}
		orders[cr.req.order] = true
		if newUser {
			users[cr.req.userKey] = true
		}
		if newSKU {
			skus[cr.req.sku] = true
		}
		batch = append(batch, cr)
	}
	return batch, rest, full
}

// placeCharge is what selectOrders charges a place of a batch.
type placeCharge struct {
	st   *placeState
	cost opCost
}

// allLean reports whether every part is lean (reserveDirect).
func allLean(parts []commitPart) bool {
	for _, p := range parts {
		if !p.lean {
			return false
		}
	}
	return len(parts) > 0
}

// placePlan is one place of a batch: what the batch takes there, its
// counter after the batch, and its fence (committer.go).
type placePlan struct {
	st    *placeState
	fence fence
	take  int64 // units the batch takes
	n     int   // the batch's parts there
	value int64 // the counter after the batch
	mod   int64 // the counter's expected ModRevision
	// absorb: the batch needs the inbox too (compared at inMod).
	absorb bool
	inMod  int64

	// A held place's (lockFence) queue and hold.
	q   *lock.Queue
	own *lock.Ownership

	// A direct place's (counterFence, planDirect): its SKU, low
	// watermark and lock prefix; the owner its counter names; whether it
	// is sold lazily; whether the batch writes its counter, and what.
	sku          *skuInfo
	lowWatermark int64
	lockPfx      string
	owner        int64
	lazy         bool
	// unrouted: an order of the batch named no route key (only such
	// orders take a place over for lazy sales: planDirect).
	unrouted bool
	settle   bool
	written  SegmentCounter
	// verified: the SKU incarnation the direct cache's mod was seen under
	// (directState.verified), 0 if unknown.
	verified int64
	// born: the direct cache is a born home's, unread (bornDirect): the
	// commit compares the counter's value to bornValue too.
	born      bool
	bornValue string

	// What stops the batch's orders there: found in planning (lost: a
	// held place's lock is gone; short: the place cannot give take; err:
	// reading it failed), or in a refused transaction's Else branch
	// (lost; raced: a direct place's counter moved or its lock was taken).
	lost, short, raced bool
	err                error
	// shortHeld says, for a held place found short, what its cache held
	// against what the batch takes: the numbers the caller's error
	// carries, since reservations should make that impossible.
	shortHeld string
}

// planPlaces gathers the places of batch, in the order they first appear,
// and plans each by its fence: a held place on its cache under the lock
// (planHeld), a direct place on its direct cache (planDirect).
func (e *Engine) planPlaces(ctx context.Context, batch []*commitReq) (map[*placeState]*placePlan, []*placePlan) {
	places := map[*placeState]*placePlan{}
	var order []*placePlan
	for _, cr := range batch {
		for _, p := range cr.parts {
			pp := places[p.st]
			if pp == nil {
				pp = &placePlan{st: p.st, q: p.q, own: p.own, sku: cr.req.sku, lowWatermark: p.lowWatermark, lockPfx: p.lockPfx}
				if p.direct {
					pp.fence = counterFence
				}
				places[p.st] = pp
				order = append(order, pp)
			}
			if pp.fence == lockFence && pp.own != p.own {
				pp.lost = true // two keys for one place: the older one is gone
			}
			pp.take += p.qty
			pp.n++
			pp.unrouted = pp.unrouted || !cr.req.routed
		}
	}
	var now int64
	if e.cfg.LazySegments {
		// Only a lazy engine asks whether a SKU is hot (planDirect).
		now = time.Now().UnixNano()
		perSKU := map[*skuInfo]int{}
		for _, cr := range batch {
			if len(cr.parts) > 0 && cr.parts[0].direct {
				perSKU[cr.req.sku]++
			}
		}
		for info, n := range perSKU {
			if n >= hotPlace {
				info.hotUntil.Store(now + int64(hotFor))
			}
		}
	}
	for _, pp := range order {
		switch pp.fence {
		case lockFence:
			e.planHeld(ctx, pp)
		case counterFence:
			pp.planDirect(e.cfg.LazySegments, e.owner, now)
		}
	}
	return places, order
}

// planHeld works out a held place's new counter from its cache under the
// lock (read first when stale). A place whose lock is gone is lost; one
// that holds less than the batch takes there (which reservations prevent
// unless etcd changed under the lock) is short.
func (e *Engine) planHeld(ctx context.Context, pp *placePlan) {
	if pp.lost || pp.own.Err() != nil {
		pp.lost = true
		return
	}
	if err := pp.st.ensure(ctx, e, pp.own); err != nil {
		if errors.Is(err, lock.ErrLost) {
			pp.lost = true
		} else {
			pp.err = err
		}
		return
	}
	st := pp.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token != pp.own.Rev() {
		pp.lost = true
	}
	pp.mod = st.modRev
	switch {
	case st.value >= pp.take:
		pp.value = st.value - pp.take
	case st.inKnown && st.value+st.inbox >= pp.take:
		pp.absorb, pp.inMod = true, st.inMod
		pp.value = st.value + st.inbox - pp.take
	default:
		pp.short = true
		pp.shortHeld = fmt.Sprintf("%s holds %d at revision %d (inbox %d, known %v) and the commit's orders take %d of it (%d reserved there)",
			st.key, st.value, st.modRev, st.inbox, st.inKnown, pp.take, st.reserved)
	}
}

// txn adds the place's fence and writes to a transaction's.
func (pp *placePlan) txn(cmps []clientv3.Cmp, ops []clientv3.Op) ([]clientv3.Cmp, []clientv3.Op) {
	st := pp.st
	if pp.fence == lockFence {
		// Held: the lock is this process's, the counter as committed;
		// the counter written (an absorb went before, absorb.go).
		cmps = append(cmps, revisionIs(clientv3.CreateRevision(pp.own.Key()), pp.own.Rev()),
			revisionIs(clientv3.ModRevision(st.key), pp.mod))
		return cmps, append(ops, clientv3.OpPut(st.key, EncodeCounter(pp.value)))
	}
	cmps = append(cmps, revisionIs(clientv3.ModRevision(st.key), pp.mod))
	if pp.born {
		// The counter is still as CreateSKU's fill wrote it for this
		// process (bornDirect): which owner the fill named is known only
		// from its value.
		cmps = append(cmps, clientv3.Compare(clientv3.Value(st.key), "=", pp.bornValue))
	}
	if pp.fencedByLockRange() {
		// The segment must have no lock key (a holder's cache is exact
		// only while nobody else writes).
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(pp.lockPfx), "=", 0).WithPrefix())
	}
	if pp.settle {
		ops = append(ops, clientv3.OpPut(st.key, EncodeSegmentCounter(pp.written)))
	}
	if pp.absorb {
		cmps = append(cmps, revisionIs(clientv3.ModRevision(st.inKey), pp.inMod))
		ops = append(ops, clientv3.OpPut(st.inKey, EncodeCounter(0)))
	}
	return cmps, ops
}

// elseReads adds the reads that tell what refused a transaction with the
// place (readElse reads them), at rev: the lock's key of a held place; a
// direct place's counter, inbox and, when fenced by it, lock range.
func (pp *placePlan) elseReads(diag []clientv3.Op, rev int64) []clientv3.Op {
	at := clientv3.WithRev(rev)
	if pp.fence == lockFence {
		return append(diag, clientv3.OpGet(pp.own.Key(), clientv3.WithKeysOnly(), at))
	}
	diag = append(diag, clientv3.OpGet(pp.st.key, at), clientv3.OpGet(pp.st.inKey, at))
	if pp.fencedByLockRange() {
		diag = append(diag, clientv3.OpGet(pp.lockPfx, clientv3.WithPrefix(), clientv3.WithCountOnly(), at))
	}
	return diag
}

// fencedByLockRange reports whether a direct place's commit compares that
// its lock has no key: always, unless this process sells it lazily and
// takes nothing from its inbox. A lazy owner's counter fences it against
// a lock holder, because the holder marks the counter before it counts
// the units (markLazy). But a lazy counter whose N is 0 holds no units,
// so a holder takes it as it is, unmarked, and counts its inbox: the
// owner must not take that inbox beside it.
func (pp *placePlan) fencedByLockRange() bool {
	return !pp.lazy || pp.absorb
}

// readElse reads the place's Else reads from the start of rs (what
// elseReads added) after a refused transaction, and returns how many it read. A held
// place whose lock key is gone is lost (its queue is told); a direct place
// whose counter moved (a lock holder marked it, another process took it
// over) or, not lazy, whose lock was taken has raced: this process's direct
// sales there are over. A direct place's cache sees its inbox as read.
func (pp *placePlan) readElse(rs []*pb.ResponseOp) int {
	st := pp.st
	if pp.fence == lockFence {
		if kvs := rs[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != pp.own.Rev() {
			pp.lost = true
			pp.q.Lose(pp.own, lock.ErrLost)
		}
		return 1
	}
	_, cntMod, err1 := decodeCounterKV(st.key, rs[0].GetResponseRange())
	in, inMod, err2 := decodeCounterKV(st.inKey, rs[1].GetResponseRange())
	read := 2
	locked := false
	if pp.fencedByLockRange() {
		locked = rs[2].GetResponseRange().GetCount() > 0
		read++
	}
	// A born home's guess (bornDirect) that was wrong: the counter is at
	// that ModRevision but names another process.
	var wrongBirth bool
	if kvs := rs[0].GetResponseRange().GetKvs(); pp.born {
		wrongBirth = len(kvs) == 0 || string(kvs[0].Value) != pp.bornValue
	}
	if cntMod != pp.mod || locked || wrongBirth || err1 != nil || err2 != nil {
		pp.raced = true
		st.forgetDirect()
		return read
	}
	st.mu.Lock()
	st.seeDirectInboxLocked(in, inMod)
	st.mu.Unlock()
	return read
}

// committed records the batch's writes, committed at rev, in the cache.
func (pp *placePlan) committed(rev int64) {
	if pp.fence == lockFence {
		pp.st.settle(pp.own, pp.take, pp.n, pp.value, rev)
		return
	}
	pp.st.settleDirect(pp.take, pp.n, pp.value, rev, pp.settle, pp.written, pp.absorb, pp.sku.created)
}

// unknown drops the cache after a transaction whose outcome is unknown:
// the place is read again before its next use.
func (pp *placePlan) unknown() {
	if pp.fence == lockFence {
		pp.st.invalidate()
		return
	}
	pp.st.forgetDirect()
}

// touches reports whether any of r's places satisfies f.
func (r *commitReq) touches(places map[*placeState]*placePlan, f func(*placePlan) bool) bool {
	for _, p := range r.parts {
		if pp := places[p.st]; pp != nil && f(pp) {
			return true
		}
	}
	return false
}

// placeErr is the first read error among r's places.
func (r *commitReq) placeErr(places map[*placeState]*placePlan) error {
	for _, p := range r.parts {
		if pp := places[p.st]; pp != nil && pp.err != nil {
			return pp.err
		}
	}
	return nil
}

// segmentParts is where the order's stock comes from, as recorded.
func (r *commitReq) segmentParts() []Part {
	parts := make([]Part, 0, len(r.parts))
	for _, p := range r.parts {
		parts = append(parts, Part{Place: p.st.place, Qty: p.qty})
	}
	return parts
}

// settleEvery is how many lazy sales a place makes before its counter is
// written again: it bounds the records a look, a Status or a lock holder
// taking the segment reads to count them.
const settleEvery = 64

// settleDue reports whether a direct commit writes the place's counter:
// when it absorbs the inbox, empties the place, takes it below the SKU's
// low watermark (so the rebalancer, which reads counters, sees it run
// low), or ends settleEvery lazy sales.
func (pp *placePlan) settleDue(before int64, unsettled int) bool {
	return pp.absorb || pp.value == 0 || (before >= pp.lowWatermark && pp.value < pp.lowWatermark) ||
		unsettled+pp.n >= settleEvery
}

// directPlaceCost is what a direct place costs a transaction: up to three
// compares (the counter, the inbox, and the lock's range when not lazy; a
// born home's counter and its value) and two puts (the counter, an
// absorb).
var directPlaceCost = opCost{cmps: 3, puts: 2}

// leanPlaceCost is what a lean direct place costs: one this process sells
// lazily, seen under its SKU's incarnation, where the batch takes no more
// than its counter holds (no inbox absorbed), compares its counter (which
// also fences the SKU: no compare of its incarnation) and puts it only
// when a settle is due. Over many SKUs nearly every place of a batch is
// lean, and charging each directPlaceCost and its SKU's compare bounded a
// batch at 25 orders where it holds 64 (docs/benchmarks.md, stop 49).
var leanPlaceCost = opCost{cmps: 1, puts: 1}

// hotPlace is how many orders of one direct batch make a place hot: a
// batch that carries that many orders there writes the counter exact and
// without an owner, at a cost of at most 1/hotPlace keys an order, rather
// than sell there lazily. A lazy segment costs every reader of its SKU a
// read of the records since its base (a look, a lock holder taking it, a
// Status), and etcd scans every record of the SKU to answer it; a SKU sold
// in batches that large gains nothing from it. Lazy sales pay where a
// commit carries few orders of each place: many SKUs.
const hotPlace = 8

// hotFor is how long a SKU stays hot in a process once one of its direct
// batches carried hotPlace orders of it: its segments are written exact
// and ownerless meanwhile, even by smaller batches. A claim by a small
// batch between two large ones would cost the other processes selling
// the SKU a takeover each, and their orders a race lost.
const hotFor = 10 * time.Second

// planDirect works out a direct place's new counter from its direct
// cache, and how the batch sells there. Without lazy segments every place
// is written with every commit. With them a place is sold in one of three
// ways:
//   - owned by this process (its counter names it): lazily, the counter
//     written only when a settle is due, or at once, exact and without
//     an owner, when the batch makes the place hot;
//   - exact and owned by nobody: the batch writes the counter, as without
//     lazy segments (the lock's range compared empty), and, unless the
//     batch makes the place hot, names this process as its owner in the
//     same write: the place is taken without a transaction of its own,
//     and no sale is missed (an exact counter has none unsettled);
//   - lazy under another owner, or with unsettled sales: short here
//     (takeDirects takes such places over before planning).
//
// now is the time the SKU's hotness is judged at (lazy engines only).
func (pp *placePlan) planDirect(lazy bool, self, now int64) {
	st := pp.st
	st.mu.Lock()
	d := st.direct
	st.mu.Unlock()
	pp.mod, pp.owner, pp.verified = d.mod, d.owner, d.verified
	owned := d.known && d.owned && d.owner == self
	if pp.born = d.born && owned; pp.born {
		pp.bornValue = EncodeSegmentCounter(d.raw)
	}
	// A place that is nobody's (its counter exact) is taken over for lazy
	// sales by a batch with an order that named no route key: such orders
	// all go to the process's one direct home of the SKU, whose lazy base
	// its own sales then keep recent. Orders with route keys spread over
	// every home their buyers name: owned lazily, each would settle only
	// every settleEvery of its own sales, and the oldest base of the SKU
	// would lag thousands of the SKU's records behind, which every look
	// reads (docs/hotpath.md, stop 45). They sell such a home eagerly (its
	// counter written exact), and lazily only one this process owns.
	plain := d.known && !d.raw.Lazy()
	claim := lazy && plain && !owned && pp.unrouted
	switch {
	case !d.known || (lazy && !owned && !plain):
		// A lazy counter this process does not own (another's, or one
		// a lock holder marked): its units are not its N, and only a
		// takeover (takeDirects, before planning) makes them known.
		pp.short = true
	case d.value >= pp.take:
		pp.value = d.value - pp.take
	case d.value+d.inbox >= pp.take && !pp.born:
		// (A born home's inbox is not known: bornDirect did not read it.)
		pp.absorb, pp.inMod = true, d.inMod
		pp.value = d.value + d.inbox - pp.take
	default:
		pp.short = true
	}
	hot := lazy && (pp.n >= hotPlace || now < pp.sku.hotUntil.Load())
	pp.lazy = lazy && owned
	switch {
	case !pp.lazy:
		// Written with the batch: exact, or (a claim of a cold place)
		// naming this process.
		pp.settle = true
		pp.written = SegmentCounter{N: pp.value}
		if claim && !hot {
			pp.written.Owner, pp.owner = self, self
		}
	case !pp.short && (hot || pp.settleDue(d.value, d.unsettled)):
		pp.settle = true
		pp.written = SegmentCounter{N: pp.value}
		if !hot {
			pp.written.Owner = self
		}
	}
}
