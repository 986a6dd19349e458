package segments

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Direct orders. A segment lock pays for itself when a process sells a SKU
// often: it is taken once, kept across orders, and every order after that
// costs no lock round trip. For a SKU a process sells a few times a second
// (most SKUs of a large sale, most of the time) it does not: taking the
// lock is an etcd write, giving it back another, every process watching
// the SKU's lock keys sees both, and the process holds the lock's queue and
// cache meanwhile. With a thousand SKUs on sale, four processes each taking
// a share of every SKU's segments spend more writes on locks than on orders.
//
// So a process that holds no segment of a SKU sells an order without a
// step (Allocate, Reserve) from a segment nobody holds, without taking its
// lock: a compare-and-swap. The order's transaction compares that the
// segment has no lock key at all (a compare over the lock's key range: no
// holder, no waiter) and that its counter (and inbox, when absorbed) are at
// the revisions this process last saw, and writes the counter's new value.
// Only a lock holder writes a counter otherwise, and a holder's key exists
// from before its first read of the counter to after its last write, so a
// direct write can neither interleave with a tenure nor act on a stale
// counter; the holder's own commits compare the counter's revision too.
// Direct orders of this process are committed together, the way held
// segments' orders are (committer.go), but in transactions of their own:
// a direct write that loses a race fails only direct orders.
//
// The process picks one free segment per SKU for its direct orders (by a
// hash of its session and the SKU, so that processes pick different ones),
// fills its cache from a look, and from then on chains its commits on what
// they wrote: no read per order. When the segment runs dry, is taken, or
// another writer moved it, the order climbs the ladder again (a look picks
// another). A SKU that turns hot grows into segment locks as before: when
// many of its orders wait on direct commits at once, or direct commits keep
// losing races, the process takes a segment (rung 4) and sells from it.

// directMaxPending is how many orders of one SKU may wait on direct commits
// in one process before the SKU counts as hot there (the process then takes
// segment locks instead).
const directMaxPending = 16

// directRaceWindow and directMaxRaces: a SKU whose direct commits in this
// process lost that many races to other writers within the window counts
// as hot (after each lost race the process moves to another segment, so
// races that go on mean that several processes sell the SKU hard).
const (
	directRaceWindow = time.Second
	directMaxRaces   = 4
)

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
}

// seeDirectLocked records a segment as a look saw it: units value, its
// counter raw at ModRevision mod, and its inbox. A place this process owns
// at mod keeps its own figures (they are as new as its last commit); a
// counter that moved ends the ownership. A look never makes a place owned,
// even one whose counter names this process: only takeDirect does, by a
// write that also fences any commit of this process whose outcome was
// lost (it compares the ModRevision that lazy commits leave unchanged, so
// without that write it could still land after the look).
func (st *placeState) seeDirectLocked(value, mod int64, raw SegmentCounter, in, inMod int64) {
	d := &st.direct
	switch {
	case d.known && d.owned && mod == d.mod:
	case d.known && mod < d.mod:
		// An older look than what this process knows.
	default:
		d.value, d.mod, d.raw = value, mod, raw
		d.owned = false
		d.unsettled = 0
	}
	if !d.known || inMod >= d.inMod {
		d.inbox, d.inMod = in, inMod
	}
	d.known = true
}

// seeDirectInboxLocked records the inbox as written by a deposit of this
// process at mod (a pull or a refill), if the direct cache is in use.
func (st *placeState) seeDirectInboxLocked(in, mod int64) {
	if d := &st.direct; d.known && mod >= d.inMod {
		d.inbox, d.inMod = in, mod
	}
}

// reserveDirect sets qty aside for a direct order if the cache says the
// place has it.
func (st *placeState) reserveDirect(qty int64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	d := &st.direct
	if !d.known || d.value+d.inbox-d.reserved < qty {
		return false
	}
	d.reserved += qty
	d.pending++
	return true
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
func (st *placeState) settleDirect(take int64, n int, value, rev int64, settled bool, written SegmentCounter, absorbed bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	d := &st.direct
	d.reserved -= take
	d.pending -= n
	d.value = value
	if settled {
		d.mod, d.raw, d.unsettled = rev, written, 0
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
	st.direct.known, st.direct.owned = false, false
	st.mu.Unlock()
}

// hotDirect reports whether many orders of the place wait on direct
// commits at once.
func (st *placeState) hotDirect() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.direct.pending >= directMaxPending
}

// lostRace records that a direct commit of the SKU lost a race to another
// writer: the next direct segment is searched for from elsewhere, and
// races that go on make the SKU hot here.
func (s *seller) lostRace(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.racesFrom) > directRaceWindow {
		s.races, s.racesFrom = 0, now
	}
	s.races++
	s.directSalt++
}

// racing reports whether the SKU's direct commits lost races lately.
func (s *seller) racing(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.races >= directMaxRaces && now.Sub(s.racesFrom) <= directRaceWindow
}

// directEligible reports whether req may be sold directly: it has no step
// (a step runs while the stock is held: that needs the lock), this process
// holds no segment of the SKU (it sells from those), and the SKU is not hot
// here.
func (s *seller) directEligible(req *allocReq) bool {
	if req.step != nil || s.heldCount() > 0 {
		return false
	}
	if st := s.directPlace(); st != nil && st.hotDirect() {
		return false
	}
	return !s.racing(time.Now())
}

// directPlace is the segment this process sells the SKU's direct orders
// from, or nil.
func (s *seller) directPlace() *placeState {
	i := int(s.directIdx.Load())
	if i < 0 || i >= len(s.sts) {
		return nil
	}
	return s.st(i)
}

// chooseDirect records a look in the direct caches of the segments
// nobody holds or waits for (as the lock watch has it), and picks the
// segment for direct orders among those that hold at least qty, in ring
// order from start: one this process owns already, else one nobody owns,
// else any (taking it over ends another process's lazy sales there). It
// reports whether one was found.
func (s *seller) chooseDirect(snap *snapshot, qty int64, start int) bool {
	n := len(s.sts)
	s.mu.Lock()
	free := make([]bool, n)
	for i := range n {
		free[i] = len(s.view[i]) == 0
	}
	s.mu.Unlock()
	self := s.e.owner
	pick := [3]int{-1, -1, -1} // owned here, owned by nobody, by another
	for k := range n {
		i := (start + k) % n
		if !free[i] {
			continue
		}
		if st := s.stIfMade(i); st != nil {
			st.see(snap, i)
		}
		if snap.segs[i] < qty {
			continue
		}
		if !s.e.cfg.LazySegments && snap.ctr[i].Lazy() {
			// Another process sells it lazily: a commit that writes the
			// counter from this look could miss its latest sales. Only
			// a lock holder (which marks it first) or a lazy seller
			// (which takes it over) sells there.
			continue
		}
		rank := 2
		switch snap.ctr[i].Owner {
		case self:
			rank = 0
		case 0:
			rank = 1
		}
		if pick[rank] < 0 {
			pick[rank] = i
		}
	}
	for _, i := range pick {
		if i >= 0 {
			if s.stIfMade(i) == nil {
				s.st(i).see(snap, i) // made now: it missed the loop's
			}
			s.directIdx.Store(int32(i))
			return true
		}
	}
	s.directIdx.Store(-1)
	return false
}

// see records segment i of a look in the place's direct cache.
func (st *placeState) see(snap *snapshot, i int) {
	st.mu.Lock()
	st.seeDirectLocked(snap.cnt[i], snap.cntMod[i], snap.ctr[i], snap.inbox[i], snap.inMod[i])
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
	st.mu.Lock()
	defer st.mu.Unlock()
	st.direct = directState{known: true, value: units, mod: rev, raw: t.next,
		inbox: in, inMod: inMod, reserved: st.direct.reserved, pending: st.direct.pending,
		owned: true, owner: t.e.owner, unsettled: records}
	return nil
}

// freeSegment is the first segment, in ring order from start, that nobody
// holds or waits for (as the lock watch has it); -1 when none is.
func (s *seller) freeSegment(start int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.view)
	for k := range n {
		if i := (start + k) % n; len(s.view[i]) == 0 {
			return i
		}
	}
	return -1
}

// directStart is where an order's search for a direct segment starts: its
// home when it named a route key (the caller's affinity is kept), else this
// process's preferred segment for the SKU. Lazy segments keep no affinity:
// every home would be a segment to take over, and processes whose buyers'
// homes meet would take it from each other at every order.
func (s *seller) directStart(req *allocReq, home int) int {
	if req.routed && !s.e.cfg.LazySegments {
		return home
	}
	return s.directHome()
}

// directHome is this process's preferred segment for the SKU's direct
// orders: a hash of its session's lease, the SKU and the races lost so far,
// so that processes selling one SKU directly tend to pick different
// segments, and two that picked the same one part after a race.
func (s *seller) directHome() int {
	s.mu.Lock()
	salt := s.directSalt
	s.mu.Unlock()
	h := fnv.New32a()
	h.Write([]byte(strconv.FormatInt(s.self(), 16)))
	h.Write([]byte(s.sku.name))
	h.Write([]byte(strconv.Itoa(salt)))
	return int(h.Sum32() % uint32(len(s.sts)))
}

// directFor is the place a direct order of req tries: its home when it
// named a route key and the home's cache can give its quantity, else the
// segment the last look picked.
func (s *seller) directFor(req *allocReq, home int) *placeState {
	if req.routed && !s.e.cfg.LazySegments && home < len(s.sts) {
		st := s.st(home)
		st.mu.Lock()
		d := &st.direct
		ok := d.known && d.value+d.inbox-d.reserved >= req.qty
		st.mu.Unlock()
		if ok {
			return st
		}
	}
	return s.directPlace()
}

// directCanGive reports whether a direct order of req can be reserved now.
func (s *seller) directCanGive(req *allocReq, home int) bool {
	if !s.directEligible(req) {
		return false
	}
	st := s.directFor(req, home)
	if st == nil {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	d := &st.direct
	return d.known && d.value+d.inbox-d.reserved >= req.qty
}

// tryDirect sells req directly when it may be (directEligible) and a
// direct segment's cache can give its quantity. ok false means it did not
// try; a result of kind resShort means the try lost (the segment was taken,
// ran dry or moved) and the order climbs the ladder.
func (s *seller) tryDirect(ctx context.Context, req *allocReq, home int) (r placeResult, ok bool) {
	if !s.directEligible(req) {
		return placeResult{}, false
	}
	st := s.directFor(req, home)
	if st == nil {
		return placeResult{}, false
	}
	if !st.reserveDirect(req.qty) {
		return placeResult{}, false
	}
	part := commitPart{st: st, qty: req.qty, direct: true, lowWatermark: s.sku.lowWatermark,
		lockPfx: s.e.keys.SegmentLock(s.sku.name, st.place.Index())}
	r = s.e.direct.submit(ctx, req, []commitPart{part}).wait(ctx)
	if r.kind == resShort {
		s.directIdx.CompareAndSwap(int32(st.place.Index()), -1)
		if r.raced {
			s.lostRace(time.Now())
		}
	}
	return r, true
}
