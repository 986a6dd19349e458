package segments

// An order's way down, in one direction: Engine.Allocate (the entry:
// validate, resolve the SKU) → Engine.sell (the ladder) → the rungs (a held
// segment, servePlain or serveStep; a direct segment, tryDirect; the dry
// rungs and the whole SKU) → the committer (committer.go), which sends the
// orders' transaction (commitplan.go). What the rungs read and reserve on is
// the places' caches (placecache.go, directcache.go).

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/lock"
	"github.com/stockctl/stockctl/internal/seats"
)

// The ladder. An order looks for its stock in this order, cheapest first,
// and stops at the first rung that serves, refuses or fails it:
//
//  1. held:  a segment this process holds (a tenure): no lock round trip,
//     its units reserved in the segment's cache (a step order takes a free
//     slot there, slots.go; a plain order needs none, servePlain).
//  2. look:  the whole SKU at one revision no older than the order's start,
//     read once for every order of this process that looks at the same
//     moment (look.go). A replay if the order ID was used meanwhile; a
//     refusal if the SKU holds too little in all (this is where a sold-out
//     SKU's orders end, without a lock or a wait); else the inboxes of the
//     held segments, as read, go into their caches (refills and releases
//     land there) and the order goes back to rung 1 if they hold it now.
//  3. pull:  when the look saw stock in the pool, some of it is moved into a
//     held segment's inbox in a short move under the pool's lock (pull.go).
//  4. grow:  one more segment within the fair share: a free one the look saw
//     holding the quantity (grow.go).
//  5. whole: the places that hold the quantity alone, as the look saw them
//     (gather.go): the pool by a pull into a held segment, and for an order
//     without a step under the pool's own lock; a segment under its lock,
//     waited for at most FallbackWait; when the stock is only in segments
//     other processes hold, fresh looks first (maxRelooks), for they sell
//     it.
//  6. gather: several places at once, locked in the global order and taken
//     from in one transaction, each lock waited for at most FallbackWait.
//
// The lock waits of rungs 5 and 6 end early when a look of another order of
// this process sees less than the order's quantity in all (lookwait.go):
// the order looks again, and that read answers it.
//
// Rungs 2 to 4 send the order back to rung 1 when they found stock (only
// the oldest waiting step order climbs them, the others wait for it); rungs
// 5 and 6 finding too little send it back to a fresh look, the stock having
// moved. An order whose lock was lost (nothing deducted) starts again at
// rung 1, at most maxLostRetries times, unless its step already ran.

// allocReq is one Allocate, AllocateFunc or Reserve call.
type allocReq struct {
	sku   *skuInfo
	order string
	qty   int64
	step  Step
	// ttl > 0 makes the order a reservation (Reserve).
	ttl   time.Duration
	buyer string
	// routed: the order named a route key, so its home segment is the
	// one it prefers (direct orders too).
	routed bool
	home   int
	// userKey is the buyer's counter, when the SKU has a per-user limit.
	userKey string
	// deadline is set by the committer when it builds the order record of
	// a reservation (only the committer's goroutine touches it).
	deadline time.Time
	// across is the whole order's SKUs over every cluster (WithAcross).
	across []string
}

// Allocate takes qty units of sku for an order, and records it: the
// ladder (below) from the segments this process holds down to the
// whole SKU; refused only when the whole SKU held too little at one
// revision. coordinator.Coordinator.Allocate documents the contract.
func (e *Engine) Allocate(ctx context.Context, sku, order string, qty int64, routeKey string, opts ...OrderOption) (*Allocation, error) {
	return e.allocate(ctx, "allocate", sku, order, qty, routeKey, nil, 0, opts)
}

// AllocateFunc is Allocate with a business step run while the stock's
// place is held (coordinator.Coordinator.AllocateFunc documents it).
func (e *Engine) AllocateFunc(ctx context.Context, sku, order string, qty int64, routeKey string, step Step, opts ...OrderOption) (*Allocation, error) {
	if step == nil {
		return nil, fmt.Errorf("allocate %s order %q: %w: step is nil", sku, order, ErrInvalid)
	}
	return e.allocate(ctx, "allocate", sku, order, qty, routeKey, step, 0, opts)
}

func (e *Engine) allocate(ctx context.Context, verb, sku, order string, qty int64, routeKey string, step Step, ttl time.Duration, opts []OrderOption) (out *Allocation, outErr error) {
	defer func() { e.metrics.allocated(verb, sku, out, outErr) }()
	var o orderOpts
	for _, opt := range opts {
		opt(&o)
	}
	errs := []error{ValidateSKU(sku), ValidateOrderID(order),
		ValidateQty(qty), ValidateRouteKey(routeKey)}
	if o.buyer != "" {
		errs = append(errs, ValidateBuyer(o.buyer))
	}
	if verb == "reserve" {
		errs = append(errs, ValidateTTL(ttl))
	}
	if err := firstErr(errs...); err != nil {
		return nil, orderErr(verb, sku, order, err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return nil, orderErr(verb, sku, order, err)
	}
	req := &allocReq{sku: info, order: order, qty: qty, step: step, ttl: ttl, buyer: o.buyer}
	if info.perUserLimit > 0 {
		if o.buyer == "" {
			return nil, orderErr(verb, sku, order, &InvalidError{Field: "buyer", Value: `""`,
				Reason: fmt.Sprintf("is required: the SKU has a per-user limit of %d", info.perUserLimit)})
		}
		if qty > info.perUserLimit {
			// No stock or counter needs reading to refuse this one; only
			// the order's record, which may say it was applied before
			// (with another qty: ErrConflict, which says more than the
			// limit does).
			resp, err := e.kv.Get(ctx, e.keys.Order(sku, order))
			if err != nil {
				return nil, orderErr(verb, sku, order, fmt.Errorf("read order: %w", err))
			}
			if len(resp.Kvs) > 0 {
				a, err := e.replay(ctx, req, resp.Kvs[0])
				if err != nil {
					return nil, orderErr(verb, sku, order, err)
				}
				return a, nil
			}
			return nil, fmt.Errorf("%s %s order %q: %w", verb, sku, order,
				&LimitExceededError{SKU: sku, Buyer: o.buyer, Limit: info.perUserLimit, Want: qty, Revision: resp.Header.Revision})
		}
		req.userKey = e.keys.User(sku, o.buyer)
	}
	if err := e.guardNewOrder(ctx, sku, order); err != nil {
		return nil, orderErr(verb, sku, order, err)
	}
	home := rand.IntN(info.segments)
	if routeKey != "" {
		home, req.routed = Route(routeKey, info.segments), true
	}
	req.home = home
	a, err := e.sell(ctx, req, home)
	if err != nil {
		return nil, orderErr(verb, sku, order, err)
	}
	return a, nil
}

// orderError is an order's error with the call, SKU and order it concerns,
// as "allocate iphone order "o-1": <err>". The text is made when asked for:
// in a sold-out storm most orders end in a refusal, and formatting each one
// would be a good part of what a refusal costs.
type orderError struct {
	verb, sku, order string
	err              error
}

func orderErr(verb, sku, order string, err error) error {
	return &orderError{verb: verb, sku: sku, order: order, err: err}
}

func (e *orderError) Error() string {
	return fmt.Sprintf("%s %s order %q: %v", e.verb, e.sku, e.order, e.err)
}

func (e *orderError) Unwrap() error { return e.err }

// maxLostRetries bounds how often one allocation starts over after a lost
// lock or session (each start-over deducted nothing).
const maxLostRetries = 3

// poolPulls is how many pulls an order at rung 5 takes part in while the
// pool holds its quantity (others' orders may take what one brought).
const poolPulls = 3

// maxRelooks is how many fresh looks an order takes, at rung 5, while the
// stock it needs is only in segments other processes hold, before it waits
// for one of their locks: those processes are selling it, and a look is
// far cheaper than a lock handoff.
const maxRelooks = 6

// relookPause is the pause before such a fresh look.
const relookPause = 2 * time.Millisecond

// sell is the one path of an order: down the ladder until a rung serves,
// refuses or fails it.
func (e *Engine) sell(ctx context.Context, req *allocReq, home int) (*Allocation, error) {
	if req.step != nil {
		// A retry of an applied order must not run the step again: look
		// before taking any slot. A duplicate racing the first application
		// may still run the step; the commit's order-ID compare lets only
		// one deduct.
		rec, err := e.kv.Get(ctx, e.orderKey(req))
		if err != nil {
			return nil, err
		}
		if len(rec.Kvs) > 0 {
			return e.replay(ctx, req, rec.Kvs[0])
		}
	}
	s, err := e.seller(req.sku)
	if err != nil {
		return nil, err
	}
	defer s.release()
	lostRetries := 0
	r := s.serve(ctx, req, home) // rungs 1 to 4
	for {
		switch r.kind {
		case resServed:
			return r.alloc, nil
		case resFailed:
			if !r.retryable() || req.step != nil || lostRetries >= maxLostRetries {
				return nil, r.err
			}
			lostRetries++
			r = s.serve(ctx, req, home)
		default: // resShort, resBusy
			r = e.whole(ctx, s, req, home, r.snap) // rungs 5 and 6
		}
	}
}

// whole is rungs 5 and 6: the places that hold the quantity alone, as snap
// (the order's look, or nil for a fresh one) saw them, then a gather.
func (e *Engine) whole(ctx context.Context, s *seller, req *allocReq, home int, snap *snapshot) placeResult {
	for relooks := 0; ; relooks++ {
		if err := context.Cause(ctx); err != nil {
			return failed(err)
		}
		if snap == nil {
			var r placeResult
			var final bool
			if snap, r, final = s.lookAt(ctx, req); final {
				return r
			}
		}
		r, relook := e.wholeAt(ctx, s, req, home, snap, relooks)
		if !relook {
			return r
		}
		if !background.Sleep(ctx, relookPause) {
			return failed(context.Cause(ctx))
		}
		snap = nil
	}
}

// wholeAt is one pass of whole over snap. relook means the order should
// look again shortly: a place it skipped is being sold by its holder, or a
// look of another order of this process saw less than the quantity in all
// (that look ends this pass's lock waits: the order is refused by its own
// fresh read rather than wait for a place sold out).
func (e *Engine) wholeAt(ctx context.Context, s *seller, req *allocReq, home int, snap *snapshot, relooks int) (r placeResult, relook bool) {
	waitCtx, stop := s.untilLooksShort(ctx, req.qty, snap.rev)
	defer stop()
	waited := false // a place skipped because its holder is selling it
	for _, p := range snap.candidates(req.qty, home) {
		if waitCtx.Err() != nil {
			break
		}
		if p.IsPool() {
			// The pool is moved into a segment this process holds and
			// sold there, a pull serving every order of the moment; a
			// step order does not wait for the pool's lock here (only
			// a gather may hold it through a step), and a plain one
			// only when this process can hold no segment to pull into.
			for range poolPulls {
				ok, err := s.pullFromPool(ctx, req, home)
				if err != nil {
					return failed(err), false
				}
				if !ok {
					break
				}
				if r := s.serve(ctx, req, home); r.kind != resShort {
					return r, false
				}
			}
			if req.step != nil || s.pullTarget(home) >= 0 {
				continue
			}
		} else if relooks < maxRelooks && s.heldByOthers([]Place{p}) {
			// Its holder is selling it: look again shortly (a shared
			// read) rather than queue for its lock (two writes).
			waited = true
			continue
		}
		if r := e.tryPlace(ctx, waitCtx, req, p, e.cfg.FallbackWait); r.kind != resShort && r.kind != resBusy {
			return r, false
		}
	}
	if waited || waitCtx.Err() != nil {
		return placeResult{}, true
	}
	return e.gather(ctx, waitCtx, req, snap), false
}

// serve sells req from the segments this process holds or can take: rungs
// 1 to 4 of the ladder. It returns resShort when it found no
// stock it can reach (the order goes on to the whole SKU), and otherwise
// the order's outcome.
func (s *seller) serve(ctx context.Context, req *allocReq, home int) placeResult {
	select {
	case <-s.viewed:
	case <-ctx.Done():
		return failed(context.Cause(ctx))
	}
	if req.step == nil {
		return s.servePlain(ctx, req, home)
	}
	return s.serveStep(ctx, req, home)
}

// servePlain sells an order without a step: it needs no slot, only units
// reserved on a held segment (home first, else the one with the most).
func (s *seller) servePlain(ctx context.Context, req *allocReq, home int) placeResult {
	dry := dryRungs{}
	for {
		best, bestAvail := -1, int64(0)
		for _, i := range s.order(home) {
			own := s.tenure(i)
			if own == nil {
				continue
			}
			if err := s.st(i).ensure(ctx, s.e, own); err != nil {
				return failed(err)
			}
			st := s.st(i)
			st.mu.Lock()
			a := st.availLocked()
			st.mu.Unlock()
			if a < req.qty {
				continue
			}
			if i == home {
				best = i
				break
			}
			if a > bestAvail {
				best, bestAvail = i, a
			}
		}
		if best >= 0 {
			if own := s.tenure(best); own != nil {
				if part, ok := reservePart(s.qs[best].Load(), own, s.st(best), req.qty); ok {
					return s.e.held.submit(ctx, req, []commitPart{part}).wait(ctx)
				}
			}
			continue
		}
		s.peekDirect(ctx, req, home)
		if r, ok := s.tryDirect(ctx, req, home); ok && r.kind != resShort {
			return r
		}
		s.climbing.Add(1)
		r, again := dry.climb(ctx, s, req, home)
		s.climbing.Add(-1)
		if !again {
			return r
		}
	}
}

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
// else any (taking it over ends another process's lazy sales there). With
// preferStart (an order's route key named start), start comes first
// unless another process sells it lazily. It reports whether one was
// found.
func (s *seller) chooseDirect(snap *snapshot, qty int64, start int, preferStart bool) bool {
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
		if k == 0 && preferStart && rank == 1 {
			rank = 0 // the route key's home, nobody's: before any other
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
// process's preferred segment for the SKU. Lazily, a home that another
// process sells lazily is not taken over for the route key's sake
// (directFor, chooseDirect): processes whose buyers' homes meet would take
// it from each other at every order, a write each time. The order sells
// from a segment of this process's own, as an order without a route key.
func (s *seller) directStart(req *allocReq, home int) int {
	if req.routed {
		return home
	}
	return s.directHome()
}

// ownableLocked reports whether this process may sell from a direct place
// without taking it from another process: eagerly always; lazily when its
// counter, as last seen, names no owner or this process. The caller holds
// the place's mu.
func (s *seller) ownableLocked(d *directState) bool {
	return !s.e.cfg.LazySegments || d.owned || d.raw.Owner == 0 || d.raw.Owner == s.e.owner
}

// firstSeatWait bounds how long an order picking a direct segment waits
// for the process's first claim of a seat, under way (three round trips to
// etcd), once in a process's life, so that the SKUs it first sells start
// apart too; a claim slower than this leaves them to the hash rather than
// stall them. At the start of a busy sale the claim takes longer than a
// few milliseconds: in a 3-second sale over 1,000 SKUs, 25 ms left 2 %
// of the picks without a seat and 2.3 to 2.9 % of the commits refused by
// another process's sale from the same segment; 250 ms, 0.06 to 0.10 %
// (docs/benchmarks.md, 27 November).
const firstSeatWait = 250 * time.Millisecond

// awaitSeat starts the process's seat claim (once) and waits for the first
// claim for at most the engine's seatWait: an order about to pick its
// direct segment. The claim starts here, before the segment is picked,
// and not at the first direct commit: a process's first orders, all of
// cold SKUs, pick their segments before any of them commits, and with the
// claim started only at a commit every one of them went by the hash (in a
// 3-second sale over 1,000 SKUs, 12 % of the picks had no seat and 4 to
// 6 % of the commits were refused by another process's sale from the same
// segment; with the claim started here and firstSeatWait, 0.1 %). An
// order whose look refuses it never gets here, so a refusal still claims
// no seat; a first order that peeks and is then refused may.
func (s *seller) awaitSeat(ctx context.Context) {
	s.e.seat.Start()
	s.e.seat.Wait(ctx, s.e.seatWait)
}

// directHome is this process's preferred segment for the SKU's direct
// orders. With a seat (a number no other live process holds, claimed from
// the process's first pick of a direct segment on: awaitSeat,
// internal/seats), it is a hash of the SKU moved by the seat's place on
// the ring of segments and by the
// races lost so far: processes selling one SKU directly start from
// different segments, whatever their count up to the SKU's segments, and
// do not race for one counter (with a hash alone two of four processes
// picked one segment of about a quarter of the SKUs, and 5 to 23 % of the
// commits of a sale over 1,000 SKUs had a group refused; 1 to 3 % with
// seats). Without one, a hash of the process's owner ID (random, made with
// the engine), the SKU and the races lost tells processes apart by chance. Not the session's lease: a process
// that sells only directly takes no lock and has no session, and with a
// lease of 0 every such process picked the same segment of every SKU
// (peeks lost 1,000 to 1,500 races in a 3-second sale over 10,000 SKUs).
func (s *seller) directHome() int {
	s.mu.Lock()
	salt := s.directSalt
	s.mu.Unlock()
	n := len(s.sts)
	if k := s.e.seat.Index(); k >= 0 {
		return (seats.Home(s.sku.name, k, n) + salt) % n
	}
	h := fnv.New32a()
	h.Write([]byte(strconv.FormatInt(s.e.owner, 16)))
	h.Write([]byte(s.sku.name))
	h.Write([]byte(strconv.Itoa(salt)))
	return int(h.Sum32() % uint32(n))
}

// directFor is the place a direct order of req tries: its home when it
// named a route key and the home's cache can give its quantity, else the
// segment the last look picked.
func (s *seller) directFor(req *allocReq, home int) *placeState {
	if req.routed && home < len(s.sts) {
		st := s.st(home)
		st.mu.Lock()
		d := &st.direct
		ok := d.known && d.value+d.inbox-d.reserved >= req.qty && s.ownableLocked(d)
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
	var self int64 // who sells lazily here: only this process's lazy places are lean
	if s.e.cfg.LazySegments {
		self = s.e.owner
	}
	reserved, lean := st.reserveDirect(req.qty, self, req.sku.created)
	if !reserved {
		return placeResult{}, false
	}
	s.e.seat.Start()
	part := commitPart{st: st, qty: req.qty, direct: true, lowWatermark: s.sku.lowWatermark,
		lockPfx: s.e.keys.SegmentLock(s.sku.name, st.place.Index()), lean: lean}
	r = s.e.direct.submit(ctx, req, []commitPart{part}).wait(ctx)
	if r.kind == resShort {
		s.directIdx.CompareAndSwap(int32(st.place.Index()), -1)
		if r.raced {
			s.lostRace(time.Now())
		}
	}
	return r, true
}

// peekDirect is a cold SKU's first direct order in this process (no look
// taken, no direct segment): it peeks at the segment the order would sell
// from (directStart) and, when nobody holds or waits for its lock, its
// counter is exact (no lazy owner, whose sales since the counter only the
// SKU's records tell) and it holds the quantity, makes it the direct
// segment, as a look would have. Otherwise, or when the peek fails, it
// does nothing: the order looks at the whole SKU on the next rung.
func (s *seller) peekDirect(ctx context.Context, req *allocReq, home int) {
	if s.lastLook.Load() != nil || s.directPlace() != nil || !s.directEligible(req) {
		return
	}
	s.awaitSeat(ctx)
	i := s.directStart(req, home)
	if s.bornInto(req, i) {
		return
	}
	_, _ = s.peekInto(ctx, i, req.qty, false)
}

// bornInto makes segment i the direct segment without a read when it is
// this process's home of a SKU born with it (bornDirect): the engine sells
// lazily, holds a seat since before the SKU was created (so the
// creator's read of the seats saw it) whose home of the SKU is i
// (seats.Home, where the fill named it: bornHomes), the SKU's fill is
// known at its meta record's revision, the segment's share of it holds
// the order's quantity, and nobody holds or waits for its lock (as the
// lock watch has it).
func (s *seller) bornInto(req *allocReq, i int) bool {
	info := s.sku
	if !s.e.cfg.LazySegments || info.fill == 0 || info.filledAt == 0 {
		return false
	}
	k, since := s.e.seat.Held()
	if k < 0 || since == 0 || since >= info.created || i != seats.Home(info.name, k, len(s.sts)) ||
		info.bornCounter(i, s.e.owner).N < req.qty || s.freeSegment(i) != i {
		return false
	}
	if !s.e.bornDirect(info, s.st(i)) {
		return false
	}
	s.e.bornSeeded.Add(1)
	s.directIdx.CompareAndSwap(-1, int32(i))
	return true
}

// peekInto peeks at segment i for direct sales (peekAt) and, when nobody
// holds or waits for its lock (as the lock watch has it, and as the peek
// read), it has a counter holding at least qty with its inbox, and that
// counter is exact (or, with ownLazy, lazily this process's own: a
// takeover then counts its records), records it in the place's direct
// cache and makes it the direct segment if there is none. It returns the
// place, or nil when the segment cannot be sold from so (or the peek
// failed: its error).
func (s *seller) peekInto(ctx context.Context, i int, qty int64, ownLazy bool) (*placeState, error) {
	if s.freeSegment(i) != i {
		return nil, nil
	}
	p, err := s.e.peekAt(ctx, s.sku, i)
	if err != nil || p.locked || p.cntMod == 0 || p.ctr.N+p.inbox < qty {
		return nil, err
	}
	verified := s.peekVerified(p)
	mine := p.ctr.Owner == s.e.owner
	// A home the SKU was born with, named to this process, is adopted.
	adopted := p.ctr.Lazy() && mine && p.ctr.Base == 0 && s.e.adoptDirect(s.st(i), p, verified)
	if !adopted && p.ctr.Lazy() && (!ownLazy || !mine) {
		// Another process sells it lazily (its units are not its N), or
		// a lock holder marked it.
		return nil, nil
	}
	st := s.st(i)
	if !adopted {
		st.mu.Lock()
		st.seeDirectLocked(p.ctr.N, p.cntMod, p.ctr, p.inbox, p.inMod, verified)
		st.mu.Unlock()
	}
	s.directIdx.CompareAndSwap(-1, int32(i))
	return st, nil
}

// peekVerified is the SKU incarnation a peeked counter is known to be
// under (0: not known).
func (s *seller) peekVerified(p peek) int64 {
	// The counter was seen under the SKU's incarnation as this process
	// knows it if it was created no later than the read that told the
	// process that incarnation (seenAt): it has existed since (a key
	// deleted and put again is created anew), and the SKU's deletion
	// deletes its counters with its meta record, so the SKU was not
	// deleted in between. Its first commit then needs no compare of the
	// incarnation: the counter's compare fences it (fencesIncarnation).
	if info := s.sku; info.seenAt != 0 && p.cntCreate != 0 && p.cntCreate <= info.seenAt {
		return info.created
	}
	return 0
}

// rung names the dry rungs (2 to 4) for dryRungs.
type rung int

const (
	rungLook rung = iota + 2
	rungPull
	rungGrow
)

// rungActions is what the dry rungs do; the seller does it, tests fake it.
type rungActions interface {
	// lookAt takes a look: final means it answered the order (a refusal,
	// a replay, an error); otherwise found says whether the held segments
	// can now give the order's quantity.
	lookAt(ctx context.Context, req *allocReq) (snap *snapshot, r placeResult, final bool)
	heldCanGive(qty int64) bool
	// directCanGive: the order may be sold directly (tryDirect) and the
	// look found it a segment for that.
	directCanGive(req *allocReq, home int) bool
	pullFromPool(ctx context.Context, req *allocReq, home int) (bool, error)
	growInto(ctx context.Context, home int, snap *snapshot, qty int64) bool
}

// dryRungs are rungs 2 to 4, each taken once per order, in turn, when no
// held segment can give the order's quantity. The pool comes before other
// segments so that a process stays within its share while the pool lasts.
type dryRungs struct {
	taken int
	snap  *snapshot // the order's look, once taken
}

// climb takes the next dry rung. again means it found stock (back to rung
// 1); otherwise the result answers the order (a refusal, a replay, a
// failure), or, once all three found nothing, is resShort (on to rung 5,
// carrying the look).
func (d *dryRungs) climb(ctx context.Context, a rungActions, req *allocReq, home int) (r placeResult, again bool) {
	for d.taken < 3 {
		next := rungLook + rung(d.taken)
		d.taken++
		var ok bool
		var err error
		switch next {
		case rungLook:
			var final bool
			if d.snap, r, final = a.lookAt(ctx, req); final {
				return r, false
			}
			ok = a.heldCanGive(req.qty) || a.directCanGive(req, home)
		case rungPull:
			if d.snap.pool > 0 {
				ok, err = a.pullFromPool(ctx, req, home)
			}
		case rungGrow:
			ok = a.growInto(ctx, home, d.snap, req.qty)
		}
		if err != nil {
			return failed(err), false
		}
		if ok {
			return placeResult{}, true
		}
	}
	return placeResult{kind: resShort, snap: d.snap}, false
}

// resultKind is what trying one rung or place came to.
type resultKind int

const (
	resShort  resultKind = iota // the place(s) held too little: try elsewhere
	resBusy                     // the lock stayed busy for the wait budget
	resServed                   // committed (or replayed): done
	resFailed                   // err says why; some errors allow starting over
)

type placeResult struct {
	kind  resultKind
	alloc *Allocation
	err   error
	snap  *snapshot // resShort from the dry rungs: the order's look
	raced bool      // resShort of a direct order: another writer moved or took its segment
}

func served(a *Allocation) placeResult { return placeResult{kind: resServed, alloc: a} }

func failed(err error) placeResult { return placeResult{kind: resFailed, err: err} }

func result(a *Allocation, err error) placeResult {
	if err != nil {
		return failed(err)
	}
	return served(a)
}

// retryable reports whether the failure deducted nothing and a new attempt
// (on a new session) may succeed.
func (r placeResult) retryable() bool {
	return errors.Is(r.err, lock.ErrLost) || errors.Is(r.err, lock.ErrSessionLost)
}

// lockFailure turns a failed lock wait into a result: a wait that ran out
// of its budget, or that a look showing too little ended
// (untilLooksShort), is resBusy (the order looks again).
func lockFailure(err error) placeResult {
	if errors.Is(err, lock.ErrLocked) || errors.Is(err, errLooksShort) {
		return placeResult{kind: resBusy}
	}
	return failed(err)
}
