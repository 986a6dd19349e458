package segments

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
)

// Ownership-affine selling. Stock in segments is fungible: an order's route
// key names a preferred (home) segment, but this process serves it from
// any segment whose lock it already holds. A process keeps a segment's
// lock across orders (a tenure, see queue.go), so an order costs no lock
// round trip at all: it takes the segment's local slot, reserves its units,
// runs its step, hands its deduction to the committer and frees the slot.
//
// How many segments a process holds is settled between the processes
// through the lock keys themselves, which every seller watches:
//   - a process selling a SKU grows, while its orders wait for a slot or
//     find no stock in what it holds, up to its fair share ⌈N/M⌉ of the N
//     segments (M: the processes holding or waiting for the SKU's segment
//     locks), taking free segments first;
//   - one below ⌊N/M⌋ with no free segment left queues for a segment of a
//     process over ⌈N/M⌉;
//   - a process yields a segment another process waits for at once when it
//     is over its share or the segment is idle, and otherwise within
//     TenureMaxHold (plus the step in progress and its commit): no process
//     waits longer than that for a segment;
//   - a segment unused for TenureIdle is given back.
// In a steady sale every process holds its share and nobody waits in etcd.

// lockKey is one waiter key of a place's lock, as the watch saw it.
type lockKey struct {
	rev   int64 // create revision
	lease int64
}

// seller sells one SKU in this process. It lives until the coordinator
// closes and keeps a reference on every segment's lock queue.
type seller struct {
	e   *Engine
	sku *skuInfo
	qs  []*lock.Queue
	sts []*placeState

	growMu sync.Mutex // one growth at a time
	pullMu sync.Mutex // one pull from the pool at a time

	mu       sync.Mutex
	view     []map[string]lockKey // per segment: waiter key → what it is
	viewed   chan struct{}        // closed once the view was first read
	waiters  list.List            // *slotWaiter, oldest first: orders with a step
	claiming bool                 // a queued claim of another process's segment runs
	timers   map[int]*time.Timer  // contended segments kept for now
}

// slotWaiter is an order with a step waiting for a free slot.
type slotWaiter struct {
	elem *list.Element
	wake chan struct{} // buffered: a signal is never lost
}

// seller returns the SKU's seller, starting it on first use.
func (e *Engine) seller(info *skuInfo) (*seller, error) {
	e.mu.Lock()
	s := e.sellers[info.name]
	e.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s = &seller{e: e, sku: info, viewed: make(chan struct{}), timers: map[int]*time.Timer{}}
	for i := range info.segments {
		q, err := e.locks.Queue(e.keys.SegmentLock(info.name, i), lock.KindSegment)
		if err != nil {
			for _, q := range s.qs {
				e.locks.Unref(q)
			}
			return nil, err
		}
		s.qs = append(s.qs, q)
		s.sts = append(s.sts, e.placeState(info.name, Segment(i)))
		s.view = append(s.view, map[string]lockKey{})
	}
	e.mu.Lock()
	if old := e.sellers[info.name]; old != nil {
		e.mu.Unlock()
		for _, q := range s.qs {
			e.locks.Unref(q)
		}
		return old, nil
	}
	e.sellers[info.name] = s
	e.mu.Unlock()
	for _, q := range s.qs {
		q.SetRetain(s.wakeHead)
	}
	e.bg.Go(s.watch)
	return s, nil
}

// watch keeps the view of the SKU's segment lock keys, and acts on it.
func (s *seller) watch(ctx context.Context) {
	pfx := s.e.keys.StockLocks(s.sku.name)
	for ctx.Err() == nil {
		resp, err := s.e.kv.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			if !background.Sleep(ctx, 100*time.Millisecond) {
				return
			}
			continue
		}
		s.mu.Lock()
		for i := range s.view {
			clear(s.view[i])
		}
		for _, kv := range resp.Kvs {
			s.applyLocked(kv, false)
		}
		s.mu.Unlock()
		select {
		case <-s.viewed:
		default:
			close(s.viewed)
		}
		s.react()
		wctx, cancel := context.WithCancel(ctx)
		for wr := range s.e.client.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil || wr.CompactRevision != 0 {
				break
			}
			s.mu.Lock()
			for _, ev := range wr.Events {
				s.applyLocked(ev.Kv, ev.Type == mvccpb.DELETE)
			}
			s.mu.Unlock()
			s.react()
		}
		cancel()
	}
}

func (s *seller) applyLocked(kv *mvccpb.KeyValue, deleted bool) {
	k, err := s.e.keys.ParseStockLock(string(kv.Key))
	if err != nil || k.Kind != keys.KindSegment || k.Index >= len(s.view) {
		return
	}
	if deleted {
		delete(s.view[k.Index], string(kv.Key))
		return
	}
	s.view[k.Index][string(kv.Key)] = lockKey{rev: kv.CreateRevision, lease: k.Lease}
}

// share is this process's fair share of the segments: lo = ⌊N/M⌋ and
// hi = ⌈N/M⌉, M counting every process that holds or waits for a segment
// lock, and this one.
func (s *seller) shareLocked(self int64) (lo, hi int) {
	members := map[int64]bool{self: true}
	for _, keys := range s.view {
		for _, k := range keys {
			members[k.lease] = true
		}
	}
	n, m := len(s.view), len(members)
	return n / m, (n + m - 1) / m
}

// heldCount counts the segments this process holds (and is not giving up).
func (s *seller) heldCount() int {
	n := 0
	for _, q := range s.qs {
		if own, _ := q.Tenure(); own != nil {
			n++
		}
	}
	return n
}

// self is the lease of this process's session (0 when there is none).
func (s *seller) self() int64 { return s.e.locks.Lease() }

// react applies the yield policy to every held segment another process
// waits for, and wakes the head waiter (a segment may have come free).
func (s *seller) react() {
	self := s.self()
	held := s.heldCount()
	s.mu.Lock()
	lo, _ := s.shareLocked(self)
	type contended struct {
		i   int
		own *lock.Ownership
	}
	var yieldNow, keep []contended
	for i, q := range s.qs {
		own, idle := q.Tenure()
		waited := false
		if own != nil {
			for key, k := range s.view[i] {
				if k.rev > own.Rev() && key != own.Key() {
					waited = true
					break
				}
			}
		}
		if !waited {
			if t := s.timers[i]; t != nil {
				t.Stop()
				delete(s.timers, i)
			}
			continue
		}
		if idle || held > lo {
			yieldNow = append(yieldNow, contended{i, own})
			held--
		} else if s.timers[i] == nil {
			keep = append(keep, contended{i, own})
		}
	}
	for _, k := range keep {
		q, own, i := s.qs[k.i], k.own, k.i
		s.timers[i] = time.AfterFunc(s.e.cfg.TenureMaxHold, func() {
			s.mu.Lock()
			delete(s.timers, i)
			s.mu.Unlock()
			q.Yield(own)
		})
	}
	s.mu.Unlock()
	for _, y := range yieldNow {
		s.qs[y.i].Yield(y.own)
	}
	s.wakeHead()
}

// wakeHead signals the oldest waiting order to look for a slot.
func (s *seller) wakeHead() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.waiters.Front(); f != nil {
		select {
		case f.Value.(*slotWaiter).wake <- struct{}{}:
		default:
		}
	}
}

// slot is a held segment's local slot, taken by an order with a step.
type slot struct {
	i    int
	h    *lock.Hold
	part commitPart
}

// pickState says why no slot was taken.
type pickState int

const (
	pickBusy pickState = iota // some held segment can serve, none is free now
	pickDry                   // no held segment can give the quantity
)

// pick takes, without waiting, a free slot of a held segment that can give
// qty (home first), with qty reserved there.
func (s *seller) pick(ctx context.Context, qty int64, home int) (*slot, pickState, error) {
	state := pickDry
	for _, i := range s.order(home) {
		q, st := s.qs[i], s.sts[i]
		own, _ := q.Tenure()
		if own == nil {
			continue
		}
		st.mu.Lock()
		known := st.token == own.Rev() && !st.stale
		enough := known && st.availLocked() >= qty
		st.mu.Unlock()
		if known && !enough {
			continue
		}
		state = pickBusy
		// Free means no order holds the slot: commits still in flight
		// there (pins) do not keep the next order out; that is the point.
		h := s.takeIdle(q)
		if h == nil {
			continue
		}
		if err := st.ensure(ctx, s.e, h.Own()); err != nil {
			_ = h.Unlock(s.e.bg.Ctx())
			return nil, state, err
		}
		part, ok := reservePart(q, h.Own(), st, qty)
		if !ok {
			_ = h.Unlock(s.e.bg.Ctx())
			continue
		}
		return &slot{i: i, h: h, part: part}, state, nil
	}
	return nil, state, nil
}

// takeIdle and acquire take a hold on one of the seller's queues, with the
// queue reference that the hold's unlock gives back.
func (s *seller) takeIdle(q *lock.Queue) *lock.Hold {
	s.e.locks.Ref(q)
	h := q.TakeIdle()
	if h == nil {
		s.e.locks.Unref(q)
	}
	return h
}

func (s *seller) acquire(ctx context.Context, q *lock.Queue, noWait bool) (*lock.Hold, error) {
	s.e.locks.Ref(q)
	h, err := q.Acquire(ctx, noWait)
	if err != nil {
		s.e.locks.Unref(q)
	}
	return h, err
}

// order is the order in which segments are tried: home, then the others
// in ring order.
func (s *seller) order(home int) []int {
	n := len(s.qs)
	out := make([]int, n)
	for k := range n {
		out[k] = (home + k) % n
	}
	return out
}

// serve sells req from the segments this process holds or can take. It
// returns resShort when it found no stock it can reach (the caller falls
// back to the whole SKU), and otherwise the order's outcome.
func (s *seller) serve(ctx context.Context, req *allocReq, home int) placeResult {
	select {
	case <-s.viewed:
	case <-ctx.Done():
		return failed(context.Cause(ctx))
	}
	if req.step == nil {
		return s.servePlain(ctx, req, home)
	}
	w := &slotWaiter{wake: make(chan struct{}, 1)}
	s.mu.Lock()
	w.elem = s.waiters.PushBack(w)
	s.mu.Unlock()
	defer s.leave(w)
	dry := dryRecovery{}
	for {
		if s.isHead(w) {
			sl, state, err := s.pick(ctx, req.qty, home)
			if err != nil {
				return failed(err)
			}
			if sl != nil {
				s.leave(w) // the next order may take another free slot
				return s.runStep(ctx, req, sl)
			}
			if state == pickDry {
				if r, again := dry.next(ctx, s, req.qty, home); !again {
					return r
				}
				continue
			}
			if s.grow(ctx, home) {
				continue
			}
		}
		select {
		case <-w.wake:
		case <-ctx.Done():
			return failed(context.Cause(ctx))
		}
	}
}

func (s *seller) isHead(w *slotWaiter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiters.Front() == w.elem
}

// leave takes w out of the queue (once) and wakes the new head.
func (s *seller) leave(w *slotWaiter) {
	s.mu.Lock()
	if w.elem == nil {
		s.mu.Unlock()
		return
	}
	s.waiters.Remove(w.elem)
	w.elem = nil
	s.mu.Unlock()
	s.wakeHead()
}

// runStep runs req's step in sl and commits it: the slot is freed as soon
// as the step returns, while the commit is still on its way.
func (s *seller) runStep(ctx context.Context, req *allocReq, sl *slot) placeResult {
	sctx, unbind := sl.h.Bind(ctx)
	err := req.step(sctx)
	unbind()
	if cause := context.Cause(sl.h.Ctx()); cause != nil {
		sl.part.cancel()
		_ = sl.h.Unlock(s.e.bg.Ctx())
		return failed(fmt.Errorf("%w during the business step (its result: %v)", cause, err))
	}
	if err != nil {
		sl.part.cancel()
		_ = sl.h.Unlock(s.e.bg.Ctx())
		return failed(fmt.Errorf("business step: %w", err))
	}
	cr := s.e.submit(req, []commitPart{sl.part})
	_ = sl.h.Unlock(s.e.bg.Ctx())
	return cr.wait(ctx)
}

// servePlain sells an order without a step: it needs no slot, only units
// reserved on a held segment (home first, else the one with the most).
func (s *seller) servePlain(ctx context.Context, req *allocReq, home int) placeResult {
	dry := dryRecovery{}
	for {
		best, bestAvail := -1, int64(0)
		for _, i := range s.order(home) {
			own, _ := s.qs[i].Tenure()
			if own == nil {
				continue
			}
			if err := s.sts[i].ensure(ctx, s.e, own); err != nil {
				return failed(err)
			}
			st := s.sts[i]
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
			own, _ := s.qs[best].Tenure()
			if own != nil {
				if part, ok := reservePart(s.qs[best], own, s.sts[best], req.qty); ok {
					return s.e.submit(req, []commitPart{part}).wait(ctx)
				}
			}
			continue
		}
		if r, again := dry.next(ctx, s, req.qty, home); !again {
			return r
		}
	}
}

// dryRecovery is what an order does, in turn, when no held segment can give
// its quantity: read the held segments' inboxes (refills land there), move
// stock from the pool into a held segment, take one more segment (within
// the fair share); then give up (resShort: the caller looks at the whole
// SKU). The pool comes before other segments so that a process stays within
// its share while the pool lasts.
type dryRecovery struct{ step int }

func (d *dryRecovery) next(ctx context.Context, s *seller, qty int64, home int) (placeResult, bool) {
	for d.step < 3 {
		d.step++
		var ok bool
		var err error
		switch d.step {
		case 1:
			ok, err = s.refreshInboxes(ctx, qty)
		case 2:
			ok, err = s.pullFromPool(ctx, qty, home)
		case 3:
			ok = s.grow(ctx, home)
		}
		if err != nil {
			return failed(err), false
		}
		if ok {
			return placeResult{}, true
		}
	}
	return placeResult{kind: resShort}, false
}

// refreshInboxes reads the inboxes of the held segments; it reports whether
// one of them can now give qty.
func (s *seller) refreshInboxes(ctx context.Context, qty int64) (bool, error) {
	var idx []int
	var ops []clientv3.Op
	for i, q := range s.qs {
		if own, _ := q.Tenure(); own != nil {
			idx = append(idx, i)
			ops = append(ops, clientv3.OpGet(s.sts[i].inKey))
		}
	}
	if len(ops) == 0 {
		return false, nil
	}
	resp, err := s.e.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return false, fmt.Errorf("read inboxes: %w", err)
	}
	found := false
	for j, i := range idx {
		st := s.sts[i]
		in, inMod, err := decodeCounterKV(st.inKey, resp.Responses[j].GetResponseRange())
		if err != nil {
			return false, err
		}
		st.mu.Lock()
		if st.token != 0 {
			st.seeInboxLocked(in, inMod)
		}
		found = found || (st.token != 0 && st.availLocked() >= qty)
		st.mu.Unlock()
	}
	return found, nil
}

// grow takes one more segment while this process holds less than its
// share: a free one (home first) at once, or, below ⌊N/M⌋ with none free,
// by queueing in the background for a segment of a process over ⌈N/M⌉. It
// reports whether it took a segment now.
func (s *seller) grow(ctx context.Context, home int) bool {
	s.growMu.Lock()
	defer s.growMu.Unlock()
	self := s.self()
	held := s.heldCount()
	s.mu.Lock()
	lo, hi := s.shareLocked(self)
	if held >= hi {
		s.mu.Unlock()
		return false
	}
	var free []int
	owners := map[int64][]int{} // lease → segments it holds
	for _, i := range s.order(home) {
		if own, _ := s.qs[i].Tenure(); own != nil {
			continue
		}
		if len(s.view[i]) == 0 {
			free = append(free, i)
			continue
		}
		first := lockKey{}
		for _, k := range s.view[i] {
			if first.rev == 0 || k.rev < first.rev {
				first = k
			}
		}
		if first.lease != self {
			owners[first.lease] = append(owners[first.lease], i)
		}
	}
	claim := -1
	if len(free) == 0 && held < max(lo, 1) && !s.claiming {
		// The segment of the process holding the most, if over its share.
		most := 0
		for _, segs := range owners {
			if len(segs) > hi && len(segs) > most {
				most, claim = len(segs), segs[0]
			}
		}
		if claim < 0 && held == 0 {
			for _, segs := range owners { // none at all: anyone's will do
				if len(segs) > most {
					most, claim = len(segs), segs[0]
				}
			}
		}
		s.claiming = claim >= 0
	}
	s.mu.Unlock()

	for _, i := range free[:min(len(free), 3)] {
		h, err := s.acquire(ctx, s.qs[i], true)
		if err != nil {
			continue // taken meanwhile
		}
		_ = h.Unlock(s.e.bg.Ctx()) // kept as an idle tenure
		return true
	}
	if claim >= 0 {
		q := s.qs[claim]
		s.e.bg.Go(func(bg context.Context) {
			defer func() {
				s.mu.Lock()
				s.claiming = false
				s.mu.Unlock()
				s.wakeHead()
			}()
			cctx, cancel := context.WithTimeout(bg, 4*s.e.cfg.TenureMaxHold+s.e.cfg.ClaimWait)
			defer cancel()
			if h, err := s.acquire(cctx, q, false); err == nil {
				_ = h.Unlock(s.e.bg.Ctx())
			}
		})
	}
	return false
}

// pullFromPool moves stock from the pool into the inbox of a held segment
// (home if held), enough for qty and at least a refill batch, in one short
// transaction under the pool's lock (only a lock holder writes a counter),
// so that an order never holds the pool through its step. One pull runs at
// a time per seller; one that finds that another pull already brought
// enough moves nothing. It reports whether the held segments can now give
// qty.
func (s *seller) pullFromPool(ctx context.Context, qty int64, home int) (bool, error) {
	s.pullMu.Lock()
	defer s.pullMu.Unlock()
	target := -1
	for _, i := range s.order(home) {
		own, _ := s.qs[i].Tenure()
		if own == nil {
			continue
		}
		st := s.sts[i]
		st.mu.Lock()
		enough := st.token == own.Rev() && !st.stale && st.availLocked() >= qty
		st.mu.Unlock()
		if enough {
			return true, nil // another pull (or a refill) got here first
		}
		if target < 0 {
			target = i
		}
	}
	if target < 0 {
		return false, nil
	}
	note := func(moved map[int]int64) []clientv3.Op {
		rec := Pull{Segment: target, Qty: moved[target], Lease: fmt.Sprintf("%x", s.self()), At: time.Now().UTC()}
		return []clientv3.Op{clientv3.OpPut(s.e.keys.Pull(s.sku.name), EncodePull(rec))}
	}
	moved, _, err := s.e.refill(ctx, s.sku.name, map[int]int64{target: max(qty, s.sku.refillBatch)}, 0, note, nil)
	if err != nil {
		return false, err
	}
	if moved[target] == 0 {
		return false, nil
	}
	// Refill recorded the new inbox in the segment's cache.
	st, own := s.sts[target], s.qs[target]
	o, _ := own.Tenure()
	st.mu.Lock()
	defer st.mu.Unlock()
	return o != nil && st.token == o.Rev() && st.availLocked() >= qty, nil
}

// HeldSegments lists the segments of sku whose locks this process holds
// now (its tenures), in index order; nil if it never sold sku.
func (e *Engine) HeldSegments(sku string) []int {
	e.mu.Lock()
	s := e.sellers[sku]
	e.mu.Unlock()
	if s == nil {
		return nil
	}
	var out []int
	for i, q := range s.qs {
		if own, _ := q.Tenure(); own != nil {
			out = append(out, i)
		}
	}
	return out
}

// holders lists, for tests and status, which lease holds each segment in
// this seller's view (0: free).
func (s *seller) holders() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int64, len(s.view))
	for i, keys := range s.view {
		first := lockKey{}
		for _, k := range keys {
			if first.rev == 0 || k.rev < first.rev {
				first = k
			}
		}
		out[i] = first.lease
	}
	return out
}

// DescribeSeller describes this process's seller of sku: per segment its
// lock queue and cache, then its waiting orders and view (for tests and
// debugging).
func (e *Engine) DescribeSeller(sku string) string {
	e.mu.Lock()
	s := e.sellers[sku]
	e.mu.Unlock()
	if s == nil {
		return "no seller"
	}
	out := ""
	for i := range s.qs {
		st := s.sts[i]
		st.mu.Lock()
		out += fmt.Sprintf("\nseg %d: %s | token %d value %d inbox %d/%v reserved %d pending %d stale %v", i,
			e.locks.Describe(e.keys.SegmentLock(sku, i)), st.token, st.value, st.inbox, st.inKnown, st.reserved, st.pending, st.stale)
		st.mu.Unlock()
	}
	s.mu.Lock()
	out += fmt.Sprintf("\nwaiters %d claiming %v view %v self %x", s.waiters.Len(), s.claiming, s.view, s.self())
	s.mu.Unlock()
	return out
}
