package segments

import (
	"context"
	"hash/fnv"
	"strconv"
	"time"
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
// segments' orders are (directcommit.go), but in transactions of their own:
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
// its counter and inbox as last seen (from a look or this process's own
// direct commit), each with the ModRevision it was seen at, and the units
// reserved by direct orders whose commits are pending.
type directState struct {
	known        bool
	value, mod   int64
	inbox, inMod int64
	reserved     int64
	pending      int
}

// seeDirectLocked records the counter and inbox as seen at their
// ModRevisions; each is kept only if no older than what is known (a look
// and a commit's answer may arrive out of order).
func (st *placeState) seeDirectLocked(value, mod, in, inMod int64) {
	d := &st.direct
	if !d.known || mod >= d.mod {
		d.value, d.mod = value, mod
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
// the counter is now value, and the inbox 0 if it was absorbed.
func (st *placeState) settleDirect(take int64, n int, value, rev int64, absorbed bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	d := &st.direct
	d.reserved -= take
	d.pending -= n
	if rev >= d.mod {
		d.value, d.mod = value, rev
	}
	if absorbed && rev >= d.inMod {
		d.inbox, d.inMod = 0, rev
	}
}

// forgetDirect drops the direct cache (a commit's outcome is unknown, or
// the place was taken): the next direct order needs a look first.
func (st *placeState) forgetDirect() {
	st.mu.Lock()
	st.direct.known = false
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
	return s.sts[i]
}

// chooseDirect records a look in the direct caches of the segments
// nobody holds or waits for (as the lock watch has it), and picks the
// segment for direct orders: the first of those, in ring order from start,
// that holds at least qty. It reports whether one was found.
func (s *seller) chooseDirect(snap *snapshot, qty int64, start int) bool {
	n := len(s.sts)
	s.mu.Lock()
	free := make([]bool, n)
	for i := range n {
		free[i] = len(s.view[i]) == 0
	}
	s.mu.Unlock()
	pick := -1
	for k := range n {
		i := (start + k) % n
		if !free[i] {
			continue
		}
		st := s.sts[i]
		st.mu.Lock()
		st.seeDirectLocked(snap.cnt[i], snap.cntMod[i], snap.inbox[i], snap.inMod[i])
		st.mu.Unlock()
		if pick < 0 && snap.segs[i] >= qty {
			pick = i
		}
	}
	s.directIdx.Store(int32(pick))
	return pick >= 0
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
// process's preferred segment for the SKU.
func (s *seller) directStart(req *allocReq, home int) int {
	if req.routed {
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
	if req.routed && home < len(s.sts) {
		st := s.sts[home]
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
	if st == nil || !st.reserveDirect(req.qty) {
		return placeResult{}, false
	}
	part := commitPart{st: st, qty: req.qty, direct: true, lockPfx: s.e.keys.SegmentLock(s.sku.name, st.place.Index())}
	r = s.e.submitDirect(ctx, req, part).wait(ctx)
	if r.kind == resShort {
		s.directIdx.CompareAndSwap(int32(st.place.Index()), -1)
		if r.raced {
			s.lostRace(time.Now())
		}
	}
	return r, true
}

// submitDirect hands a direct order to the direct committer.
func (e *Engine) submitDirect(ctx context.Context, req *allocReq, part commitPart) *commitReq {
	cr := &commitReq{req: req, parts: []commitPart{part}, ctx: ctx, done: make(chan struct{})}
	e.directs.Submit(cr)
	return cr
}
