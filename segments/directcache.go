package segments

import (
	"cmp"
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The direct cache of a place (placeState.direct): what a process that
// sells a segment without its lock (sell.go, direct orders) knows of it,
// and the lazy takeover of a segment from another process (takeDirect,
// takeDirects).

// directState is a place's cache for direct orders (placeState.direct):
// its units and inbox as last seen (from a look or this process's own
// direct commit), the counter as stored and its ModRevision, and the units
// reserved by direct orders whose commits are pending.
//
// Direct orders are sold lazily (SegmentCounter): the process first takes
// the segment over (takeDirect: its counter names this process as owner,
// a write that ends any other owner's lazy sales), and from then on its
// commits compare the counter's ModRevision and write only the orders'
// records; the counter is written (settled) only now and then
// (settleDue). owned says the counter names this process at mod.
type directState struct {
	known        bool
	value, mod   int64 // units; the counter's ModRevision
	raw          SegmentCounter
	inbox, inMod int64
	reserved     int64
	pending      int
	owned        bool
	owner        int64 // the lease owned under
	unsettled    int   // orders sold since the counter was last written
	// verified is the SKU's incarnation (its meta record's CreateRevision)
	// known to be current when the counter had ModRevision mod, 0 if not
	// known: a look that read the meta record with the counter, or a
	// commit that wrote the counter at mod and compared the incarnation
	// (or was fenced by verified places). A commit comparing the counter
	// at mod is then fenced against a deleted or re-created SKU by that
	// compare alone (deleting a SKU deletes its counters in the same
	// transaction, and creating it writes them anew): build leaves out the
	// incarnation's compare (commitplan.go, fencesIncarnation).
	verified int64
	// born: the cache was seeded from the SKU's meta record alone
	// (bornDirect), not from a read of the counter: raw is what CreateSKU's
	// fill wrote there, naming this process, at ModRevision mod. The first
	// commit compares the counter's value to raw beside its ModRevision,
	// which proves it, and ends born (settleDirect); a refused one ends
	// the cache (readElse).
	born bool
}

// seeDirectLocked records a segment as a look saw it: units value, its
// counter raw at ModRevision mod, and its inbox. A place this process owns
// at mod keeps its own figures (they are as new as its last commit); a
// counter that moved ends the ownership. A look never makes a place owned,
// even one whose counter names this process: only takeDirect does, by a
// write that also fences any commit of this process whose outcome was
// lost (it compares the ModRevision that lazy commits leave unchanged, so
// without that write it could still land after the look).
func (st *placeState) seeDirectLocked(value, mod int64, raw SegmentCounter, in, inMod, verified int64) {
	d := &st.direct
	switch {
	case d.known && d.owned && mod == d.mod && (!d.born || raw == d.raw):
		if verified != 0 {
			d.verified = verified // the same counter, seen in a checked read
		}
		d.born = false // its value seen: the ModRevision fences it alone
	case d.known && mod < d.mod:
		// An older look than what this process knows.
	default:
		d.value, d.mod, d.raw = value, mod, raw
		d.verified = verified
		d.owned, d.born = false, false
		d.unsettled = 0
	}
	if !d.known || inMod >= d.inMod {
		d.inbox, d.inMod = in, inMod
	}
	d.known = true
}

// adoptDirect makes st owned here for lazy sales from what a peek p read,
// without the takeover's write, when p's counter names this process with
// no base of its own (it is exact as of its ModRevision, and only its
// owner's later sales, by records alone, are not in it) and this engine
// has never owned a place of the SKU lazily (ownLazily): then it has
// never sent a commit that sells there by records alone, so none can land
// after the peek, and the counter's N is the units. Such a counter is a
// home the SKU was born with, named to this process (CreateSKU's
// bornHomes), or one this process's own claim wrote in a commit whose
// answer was lost (it holds the units after that commit's orders). Any
// other writer moves the counter, which fails the first commit. A place
// already owned here at that counter keeps its own, newer figures.
// Reports whether st is owned here.
func (e *Engine) adoptDirect(st *placeState, p peek, verified int64) bool {
	// Owned here at that counter already (another order's peek adopted
	// it): its own, newer figures stand.
	ownedAt := func(d *directState) bool { return d.known && d.owned && d.owner == e.owner && d.mod == p.cntMod }
	st.mu.Lock()
	already := ownedAt(&st.direct)
	st.mu.Unlock()
	// e.mu is not taken under st.mu (SettleOwned, evictIdle take them the
	// other way round): the first ownership is claimed between the two.
	if !already && !e.ownLazily(st.sku) {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	d := &st.direct
	switch {
	case ownedAt(d):
		if verified != 0 {
			d.verified = verified
		}
		return true
	case already:
		return false // its cache moved on meanwhile: not what was adopted
	}
	st.direct = directState{known: true, value: p.ctr.N, mod: p.cntMod, raw: p.ctr,
		inbox: p.inbox, inMod: p.inMod, reserved: d.reserved, pending: d.pending,
		owned: true, owner: e.owner, verified: verified}
	return true
}

// bornDirect seeds st's direct cache, without a read, as the home CreateSKU's
// fill named to this process (fillSegments, bornHomes): the counter holds
// the segment's share of the fill, owned by this process, at the meta
// record's ModRevision (info.fill, info.filledAt). It does so only for a
// place whose cache is empty, of a SKU of which this engine never owned a
// place lazily (ownLazily), and reports whether it did.
//
// That is what a peek would have read and adoptDirect taken, but unproven:
// the seat this process holds now may not be the one the fill saw, and
// another process may have written the counter since. So the first commit
// also compares the counter's value (placePlan.txn): a counter at that
// ModRevision with that value is exactly the born home (the ModRevision is
// the completing transaction's, of the SKU's incarnation info.created),
// with nothing sold since by anyone but this engine, which never sold
// there. Where it is not, that commit is refused, and the orders climb
// the ladder to a look; the SKU's later first orders take the peek and a
// takeover, as for a SKU whose home was never born.
func (e *Engine) bornDirect(info *skuInfo, st *placeState) bool {
	c := info.bornCounter(st.place.Index(), e.owner)
	st.mu.Lock()
	known := st.direct.known
	st.mu.Unlock()
	if known || !e.ownLazily(info.name) {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	d := &st.direct
	if d.known {
		return false // a look got there meanwhile
	}
	st.direct = directState{known: true, value: c.N, mod: info.filledAt, raw: c,
		reserved: d.reserved, pending: d.pending, owned: true, owner: e.owner, verified: info.created, born: true}
	return true
}

// ownLazily records that this engine owns a place of sku lazily, before
// its cache says so (and so before any commit sells there by records
// alone), and reports whether it never had: adoptDirect takes a counter
// naming this engine at its N only then.
func (e *Engine) ownLazily(sku string) (first bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, had := e.ownedOnce[sku]
	e.ownedOnce[sku] = struct{}{}
	return !had
}

// seeDirectInboxLocked records the inbox as written by a deposit of this
// process at mod (a pull or a refill), if the direct cache is in use.
func (st *placeState) seeDirectInboxLocked(in, mod int64) {
	if d := &st.direct; d.known && mod >= d.inMod {
		d.inbox, d.inMod = in, mod
	}
}

// reserveDirect sets qty aside for a direct order if the cache says the
// place has it. lean says the place is one self sells lazily, seen under
// the SKU's incarnation created (its counter's compare fences the SKU:
// fencesIncarnation), and its counter holds qty beside every reservation
// before it (no inbox to absorb): the part's commit is expected to cost
// leanPlaceCost and no compare of its SKU. self is 0 when nothing is sold
// lazily.
func (st *placeState) reserveDirect(qty, self, created int64) (ok, lean bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	d := &st.direct
	if !d.known || d.value+d.inbox-d.reserved < qty {
		return false, false
	}
	lean = self != 0 && d.owned && d.owner == self && d.verified == created && created != 0 && d.value-d.reserved >= qty && !d.born
	d.reserved += qty
	d.pending++
	return true, lean
}

// unreserveDirect gives back a direct reservation that was not committed.
func (st *placeState) unreserveDirect(qty int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.direct.reserved -= qty
	st.direct.pending--
}

// settleDirect records a direct commit of take units (n orders) at rev:
// the place now holds value; the counter was written (settled, as
// written: the place is owned here if it names an owner) or not, and the
// inbox emptied if it was absorbed.
//
// A commit that succeeded proved the SKU's incarnation verified at rev
// (it compared it, or was fenced by places verified under it).
func (st *placeState) settleDirect(take int64, n int, value, rev int64, settled bool, written SegmentCounter, absorbed bool, verified int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	d := &st.direct
	d.reserved -= take
	d.pending -= n
	d.value = value
	d.born = false // a born cache's value was compared by the commit
	if settled {
		d.mod, d.raw, d.unsettled, d.verified = rev, written, 0, verified
		d.owned = written.Owner != 0
		if d.owned {
			d.owner = written.Owner
		}
	} else {
		d.unsettled += n
	}
	if absorbed && rev >= d.inMod {
		d.inbox, d.inMod = 0, rev
	}
}

// forgetDirect drops the direct cache (a commit's outcome is unknown, or
// the place was taken): the next direct order needs a look first.
func (st *placeState) forgetDirect() {
	st.mu.Lock()
	st.direct.known, st.direct.owned, st.direct.born = false, false, false
	st.mu.Unlock()
}

// hotDirect reports whether many orders of the place wait on direct
// commits at once.
func (st *placeState) hotDirect() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.direct.pending >= directMaxPending
}

// see records segment i of a look in the place's direct cache.
func (st *placeState) see(snap *snapshot, i int) {
	st.mu.Lock()
	st.seeDirectLocked(snap.cnt[i], snap.cntMod[i], snap.ctr[i], snap.inbox[i], snap.inMod[i], snap.verified)
	st.mu.Unlock()
}

// takeDirect makes this process the owner of st's segment for lazy direct
// sales, unless it is already (the direct committer calls it for the
// places of orders that passed their buyers' limits, before planning): in one transaction that compares the
// counter's ModRevision as last seen and that the segment's lock has no
// key, it rewrites the counter with its N and base and this process as
// owner, and reads the records created after the base; the place then
// holds N less their parts from it. The rewrite fails any commit of the
// previous owner that comes after it, so none of its sales is missed.
// Reports whether the place is owned here.
func (e *Engine) takeDirect(ctx context.Context, info *skuInfo, st *placeState) (bool, error) {
	st.loadMu.Lock()
	defer st.loadMu.Unlock()
	st.mu.Lock()
	d := st.direct
	st.mu.Unlock()
	if d.known && d.owned && d.owner == e.owner {
		return true, nil
	}
	if !d.known {
		return false, nil
	}
	t := e.newTakeover(info, st, d)
	resp, err := e.kv.Txn(ctx).If(t.cmps()...).Then(t.ops()...).Commit()
	if err != nil {
		st.forgetDirect()
		return false, fmt.Errorf("take over %s: %w", st.key, err)
	}
	if !resp.Succeeded {
		st.forgetDirect()
		return false, nil
	}
	return true, t.apply(resp.Responses, resp.Header.Revision)
}

// takeover is one place's takeover (takeDirect), as compares and ops that
// a transaction may carry beside other places'.
type takeover struct {
	e    *Engine
	info *skuInfo
	st   *placeState
	d    directState // the cache it was planned on
	l    lazySeg
	next SegmentCounter
}

func (e *Engine) newTakeover(info *skuInfo, st *placeState, d directState) *takeover {
	l := lazySeg{index: st.place.Index(), base: d.raw.BaseAt(d.mod), n: d.raw.N}
	return &takeover{e: e, info: info, st: st, d: d, l: l, next: SegmentCounter{N: d.raw.N, Base: l.base, Owner: e.owner}}
}

// cmps: the counter as last seen, no lock key, and the SKU's incarnation
// (a stale view must not write a counter the SKU may not have).
func (t *takeover) cmps() []clientv3.Cmp {
	return append([]clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(t.st.key), "=", t.d.mod),
		clientv3.Compare(clientv3.CreateRevision(t.e.keys.SegmentLock(t.st.sku, t.l.index)), "=", 0).WithPrefix(),
	}, t.e.incarnation(t.info)...)
}

// ops are the counter's rewrite, the inbox's read and (when the counter
// holds units) the read of the records since the base: takeoverOps of them.
func (t *takeover) ops() []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpPut(t.st.key, EncodeSegmentCounter(t.next)), clientv3.OpGet(t.st.inKey)}
	if t.l.n > 0 {
		ops = append(ops, t.e.unsettledRead(t.st.sku, 0, []lazySeg{t.l}))
	}
	return ops
}

// apply fills the direct cache from the answers to ops (rs, starting at
// its first), committed at rev: the place is owned here.
func (t *takeover) apply(rs []*pb.ResponseOp, rev int64) error {
	st, i := t.st, t.l.index
	var sold map[int]int64
	var records int
	if t.l.n > 0 {
		kvs := rs[2].GetResponseRange().GetKvs()
		var err error
		if sold, err = unsettledSales(st.sku, []lazySeg{t.l}, kvs); err != nil {
			st.forgetDirect()
			return err
		}
		records = len(kvs)
	}
	units := t.l.n - sold[i]
	if units < 0 {
		st.forgetDirect()
		return &CorruptError{Key: st.key, Value: []byte(EncodeSegmentCounter(t.d.raw)),
			Err: fmt.Errorf("orders since revision %d took %d units from a segment that held %d", t.l.base, sold[i], t.l.n)}
	}
	in, inMod, err := decodeCounterKV(st.inKey, rs[1].GetResponseRange())
	if err != nil {
		st.forgetDirect()
		return err
	}
	t.e.ownLazily(st.sku)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.direct = directState{known: true, value: units, mod: rev, raw: t.next,
		inbox: in, inMod: inMod, reserved: st.direct.reserved, pending: st.direct.pending,
		owned: true, owner: t.e.owner, unsettled: records, verified: t.info.created}
	return nil
}

// takeDirects takes over the places of batch this process does not own yet
// (takeDirect), once each, after the buyers' limits have been judged: an
// order refused there writes nothing. Orders on a place that could not be
// taken are answered resShort (they climb the ladder); if any was, taken
// is false and again holds the rest, to be planned afresh.
func (e *Engine) takeDirects(ctx context.Context, batch []*commitReq) (again []*commitReq, taken bool) {
	lost := map[*placeState]error{}
	seen := map[*placeState]bool{}
	var todo []*takeover
	for _, cr := range batch {
		for _, p := range cr.parts {
			if !p.direct || seen[p.st] {
				continue
			}
			seen[p.st] = true
			p.st.mu.Lock()
			d := p.st.direct
			p.st.mu.Unlock()
			switch {
			case d.known && d.owned && d.owner == e.owner:
			case d.known && !d.raw.Lazy():
				// Exact and owned by nobody: the commit itself claims it
				// (planDirect).
			case !d.known:
				lost[p.st] = nil
			default:
				todo = append(todo, e.newTakeover(cr.req.sku, p.st, d))
			}
		}
	}
	for st, err := range e.takeOver(ctx, todo) {
		lost[st] = err
	}
	if len(lost) == 0 {
		return batch, true
	}
	for _, cr := range batch {
		var hit bool
		var err error
		for _, p := range cr.parts {
			if e2, ok := lost[p.st]; ok {
				hit, err = true, cmp.Or(err, e2)
			}
		}
		switch {
		case hit && err != nil:
			cr.finish(failed(err))
		case hit:
			cr.finish(placeResult{kind: resShort, raced: true})
		default:
			again = append(again, cr)
		}
	}
	return again, false
}

// takeOver runs takeovers together, in transactions of up to MaxTxnOps
// compares and ops (a refused one is tried place by place, takeDirect),
// and returns the places it could not take: with the error that stopped
// it, or nil where another writer got there first.
func (e *Engine) takeOver(ctx context.Context, todo []*takeover) map[*placeState]error {
	lost := map[*placeState]error{}
	per := max(1, e.cfg.MaxTxnOps/4)
	for len(todo) > 0 {
		chunk := todo[:min(per, len(todo))]
		todo = todo[len(chunk):]
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		opsOf := make([]int, len(chunk)) // each takeover's share of ops
		for i, t := range chunk {
			tops := t.ops()
			cmps, ops, opsOf[i] = append(cmps, t.cmps()...), append(ops, tops...), len(tops)
		}
		resp, err := e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
		switch {
		case err != nil:
			for _, t := range chunk {
				t.st.forgetDirect()
				lost[t.st] = fmt.Errorf("take over %s: %w", t.st.key, err)
			}
		case resp.Succeeded:
			next := 0
			for i, t := range chunk {
				if err := t.apply(resp.Responses[next:next+opsOf[i]], resp.Header.Revision); err != nil {
					lost[t.st] = err
				}
				next += opsOf[i]
			}
		default:
			for _, t := range chunk {
				if owned, err := e.takeDirect(ctx, t.info, t.st); err != nil || !owned {
					lost[t.st] = err
				}
			}
		}
	}
	return lost
}
