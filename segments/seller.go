package segments

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockctl/stockctl/internal/lock"
)

// Ownership-affine selling. Stock in segments is fungible: an order's route
// key names a preferred (home) segment, but this process serves it from
// any segment whose lock it already holds. A process keeps a segment's
// lock across orders (a tenure, see internal/lock/retained.go), so an order costs no lock
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

//
// The seller's files: seller.go (the seller and its state), sellerview.go
// (the watch of the lock keys and the yield policy applied to it), share.go
// (the fair-share policy itself, pure), slots.go (step orders' local FIFO),
// sell.go (rungs 1 to 4 of the ladder), pull.go and grow.go (rungs 2 to 4).
//
// Lock order: seller.mu may be held while taking a lock.Queue's mutex (the
// queues' Tenure), never the other way round (a queue calls wakeHead without
// its mutex); a placeState's mutex is taken alone.

// lockKey is one waiter key of a place's lock, as the watch saw it.
type lockKey struct {
	rev   int64 // create revision
	lease int64
}

// seller sells one SKU in this process. It lives until it is reaped or the
// coordinator closes, and keeps a reference on each segment's lock queue it
// made.
type seller struct {
	e   *Engine
	sku *skuInfo
	// qs are the segments' lock queues, made on first use (queue): a
	// process that sells a SKU only directly, as most of a sale over many
	// SKUs do, makes none (20 were 70 % of what a SKU's first order in a
	// process allocated and cost; BenchmarkSellerCreate). qmu orders their
	// making.
	qs  []atomic.Pointer[lock.Queue]
	qmu sync.Mutex
	// reaped: the reaper gave the queues back (under qmu); none is made
	// after it, or a lock taken through a forgotten seller (lockPlace)
	// would be kept as a tenure nobody sells from.
	reaped bool
	// sts are the segments' place caches, made on first use (st): a
	// process that sells a SKU from one segment keeps one, not one per
	// segment (over 10,000 SKUs that was 40 % of its heap).
	sts []atomic.Pointer[placeState]

	mu       sync.Mutex
	view     []map[string]lockKey // per segment: waiter key → what it is
	viewed   chan struct{}        // closed once the view was first read
	waiters  list.List            // *slotWaiter, oldest first: orders with a step
	claiming bool                 // a queued claim of another process's segment runs
	pulling  chan struct{}        // a pull from the pool runs; closed when it ends
	growing  chan struct{}        // a growth runs; closed when it ends
	timers   map[int]*time.Timer  // contended segments kept for now
	// Direct orders (sell.go's tryDirect): races lost since racesFrom, and the salt
	// of directHome (bumped by each).
	races      int
	racesFrom  time.Time
	directSalt int

	lastLook  atomic.Pointer[snapshot] // this process's last look at the SKU (a hint): setLook
	looked    chan struct{}            // under mu: closed at the next setLook (nextLook)
	directIdx atomic.Int32             // the segment of direct orders (tryDirect); -1: none
	climbing  atomic.Int64             // orders climbing the dry rungs now (a pull's size)

	// Guarded by the engine's mu: uses taken and not given back, and when
	// the last one was.
	users    int
	lastUsed time.Time
}

// slotWaiter is an order with a step waiting for a free slot.
type slotWaiter struct {
	elem *list.Element
	wake chan struct{} // buffered: a signal is never lost
}

// seller returns the SKU's seller, made on first use, with a use taken:
// the caller gives it back with release when its order is done. A seller
// nobody used for SellerIdle, holding no segment, is evicted (reap), so
// that an idle SKU costs this process nothing but its cached meta.
func (e *Engine) seller(info *skuInfo) (*seller, error) {
	if info.gone.Load() {
		return nil, skuGoneErr(info, false)
	}
	e.mu.Lock()
	if s := e.sellers[info.name]; s != nil && s.sku.created == info.created {
		s.users++
		e.mu.Unlock()
		return s, nil
	}
	e.mu.Unlock()
	s := &seller{e: e, sku: info, viewed: make(chan struct{}), timers: map[int]*time.Timer{}}
	s.directIdx.Store(-1)
	s.sts = make([]atomic.Pointer[placeState], info.segments)
	s.qs = make([]atomic.Pointer[lock.Queue], info.segments)
	for range info.segments {
		s.view = append(s.view, map[string]lockKey{})
	}
	e.mu.Lock()
	if old := e.sellers[info.name]; old != nil && old.sku.created == info.created {
		old.users++
		e.mu.Unlock()
		return old, nil
	} else if old != nil {
		// A seller of another incarnation of the SKU: it is reaped once
		// idle, and gets no new request.
		e.sellers[info.name+"\x00"+strconv.FormatInt(old.sku.created, 10)] = old
	}
	e.sellers[info.name] = s
	s.users = 1
	if !e.reaping {
		e.reaping = true
		e.bg.Go(e.reap)
	}
	e.mu.Unlock()
	e.lockWatch.register(s)
	return s, nil
}

// queue is segment i's lock queue, made and registered with the lock engine
// (its tenures retained, waking the seller's waiting orders) on first use.
func (s *seller) queue(i int) (*lock.Queue, error) {
	if q := s.qs[i].Load(); q != nil {
		return q, nil
	}
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if q := s.qs[i].Load(); q != nil {
		return q, nil
	}
	if s.reaped {
		return nil, errSellerReaped
	}
	q, err := s.e.locks.Queue(s.e.keys.SegmentLock(s.sku.name, i), lock.KindSegment)
	if err != nil {
		return nil, err
	}
	q.SetRetain(s.wakeHead)
	s.qs[i].Store(q)
	return q, nil
}

// errSellerReaped: the seller was forgotten (reap.go) while a caller still
// had it; its caller takes the lock without it.
var errSellerReaped = errors.New("the SKU's seller was forgotten")

// tenure is this process's tenure of segment i, nil when it holds none (or
// never made its queue).
func (s *seller) tenure(i int) *lock.Ownership {
	q := s.qs[i].Load()
	if q == nil {
		return nil
	}
	own, _ := q.Tenure()
	return own
}

// st is segment i's place cache, made on first use.
func (s *seller) st(i int) *placeState {
	if st := s.sts[i].Load(); st != nil {
		return st
	}
	st := s.e.placeState(s.sku.name, Segment(i)) // one per place in the engine
	s.sts[i].Store(st)
	return st
}

// stIfMade is segment i's place cache if it was made, else nil.
func (s *seller) stIfMade(i int) *placeState { return s.sts[i].Load() }

// release gives back a use taken by Engine.seller.
func (s *seller) release() {
	s.e.mu.Lock()
	s.users--
	s.lastUsed = time.Now()
	s.e.mu.Unlock()
}

// heldCount counts the segments this process holds (and is not giving up).
func (s *seller) heldCount() int {
	n := 0
	for i := range s.qs {
		if s.tenure(i) != nil {
			n++
		}
	}
	return n
}

// self is the lease of this process's session (0 when there is none).
func (s *seller) self() int64 { return s.e.locks.Lease() }

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
	for i := range s.qs {
		if s.tenure(i) != nil {
			out = append(out, i)
		}
	}
	return out
}

// ViewedHolders is, per segment of sku, the lease holding its lock as this
// process's view has it (0: free); nil if this process has no seller of
// sku. The view follows the process's one watch of the lock keys
// (lockwatch.go): tests check that it recovers from a broken watch.
func (e *Engine) ViewedHolders(sku string) []int64 {
	e.mu.Lock()
	s := e.sellers[sku]
	e.mu.Unlock()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int64, len(s.view))
	for i, keys := range s.view {
		out[i] = holderOf(keys)
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
		st := s.st(i)
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
