package segments

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/lock"
)

// placeState is this process's view of one place (a SKU's pool or one of
// its segments): a cache of its counter and inbox, and the units reserved
// by orders of this process whose commits are pending.
//
// Who writes what: a counter (the pool's or a segment's) is written only by
// the holder of its place's lock; a segment's inbox is written by anyone
// (refills, releases) under a compare of its revision, only ever growing,
// and emptied only by the segment's lock holder when it absorbs it.
//
// So the cache is valid only under the etcd lock key it was filled under
// (token, the key's create revision): while this process holds that key,
// nobody else writes the counter, so the cache is exact; its inbox is a
// lower bound. Every write still compares the
// counter's (and an absorbed inbox's) ModRevision, so a stale cache can
// cost a retry, never a wrong write.
//
// Reservations are what make pipelined commits safe: an order reserves its
// units before its business step and keeps them until its commit resolves,
// so the next order on the place sees the stock as it will be once every
// pending commit lands (a lower bound), and never plans with units a
// predecessor will take.
type placeState struct {
	sku   string
	place Place
	key   string // the counter
	inKey string // the inbox; "" for the pool

	loadMu sync.Mutex // one load of the cache at a time

	mu       sync.Mutex
	token    int64 // fencing token the cache was filled under; 0 = none
	value    int64 // the counter as last committed
	modRev   int64
	inKnown  bool
	inbox    int64 // the inbox as last read or written by this process
	inMod    int64
	reserved int64 // units reserved under token, not yet committed
	pending  int   // reservations not yet resolved, under token
	stale    bool  // a commit's outcome is unknown: load before the next
	frozen   bool  // a direct write is waiting for pending commits to end
	quiet    chan struct{}

	// direct is the cache of direct orders (directcache.go), which hold no
	// lock: apart from the above, which is valid only under a lock key.
	direct directState
}

// placeState returns the cache of a place, made on first use.
func (e *Engine) placeState(sku string, p Place) *placeState {
	e.mu.Lock()
	defer e.mu.Unlock()
	id := placeID{sku, p}
	st := e.places[id]
	if st == nil {
		st = &placeState{sku: sku, place: p, key: e.counterKey(sku, p)}
		if !p.IsPool() {
			st.inKey = e.keys.Inbox(sku, p.Index())
		}
		e.places[id] = st
	}
	return st
}

func (e *Engine) counterKey(sku string, p Place) string {
	if p.IsPool() {
		return e.keys.Pool(sku)
	}
	return e.keys.Segment(sku, p.Index())
}

func (e *Engine) placeLock(sku string, p Place) string {
	if p.IsPool() {
		return e.keys.PoolLock(sku)
	}
	return e.keys.SegmentLock(sku, p.Index())
}

// ensure makes the cache valid under own (the caller holds own's key, as a
// hold or a tenure): it reads the counter and inbox if the cache was filled
// under another key, or if a commit's outcome is unknown.
func (st *placeState) ensure(ctx context.Context, e *Engine, own *lock.Ownership) error {
	// Create revisions grow with every new key: a cache filled under a
	// newer key than own means own is gone, and must not be loaded back
	// (that would drop the newer key's reservations).
	check := func() (bool, error) {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.token > own.Rev() {
			return false, lock.ErrLost
		}
		return st.token == own.Rev() && !st.stale, nil
	}
	if ok, err := check(); ok || err != nil {
		return err
	}
	st.loadMu.Lock()
	defer st.loadMu.Unlock()
	if ok, err := check(); ok || err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		resp, err := e.kv.Txn(ctx).Then(st.reads()...).Commit()
		if err != nil {
			return fmt.Errorf("read %s: %w", st.key, err)
		}
		err = st.fill(own, resp.Responses)
		if !errors.Is(err, errLazyCounter) {
			return err
		}
		// Another process sold from the segment without its lock: end
		// that and count its sales (markLazy). A counter that moved
		// meanwhile is read again.
		kv := resp.Responses[0].GetResponseRange().GetKvs()[0]
		if done, err := st.markLazy(ctx, e, own, kv.Value, kv.ModRevision); done || err != nil {
			return err
		}
		if attempt >= 8 {
			return fmt.Errorf("mark %s: its counter kept moving: %w", st.key, ErrContention)
		}
	}
}

// errLazyCounter: a segment's counter is lazy (SegmentCounter) and may have
// unsettled sales, so its units need the order records: the holder of its
// lock marks it first (markLazy).
var errLazyCounter = errors.New("the segment's counter is lazy")

// markLazy ends the lazy sales of a segment whose lock own holds, and
// fills the cache with its units: in one transaction fenced by the lock
// key and the counter's ModRevision as read (value at mod), it rewrites the
// counter with its N and base and no owner (which fails the owner's next
// commit, as it compares the ModRevision), and reads the records created
// after the base: every sale the owner made is among them, and none can
// follow. A second transaction, fenced the same way, writes the exact
// units. done is false when the counter moved since it was read.
func (st *placeState) markLazy(ctx context.Context, e *Engine, own *lock.Ownership, value []byte, mod int64) (done bool, err error) {
	c, err := DecodeSegmentCounter(st.key, value)
	if err != nil {
		return false, err
	}
	l := lazySeg{index: st.place.Index(), base: c.BaseAt(mod), n: c.N}
	resp, err := e.kv.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(own.Key()), "=", own.Rev()),
		clientv3.Compare(clientv3.ModRevision(st.key), "=", mod),
	).Then(
		clientv3.OpPut(st.key, EncodeSegmentCounter(SegmentCounter{N: c.N, Base: l.base})),
		clientv3.OpGet(st.inKey),
		e.unsettledRead(st.sku, 0, []lazySeg{l}),
	).Else(clientv3.OpGet(own.Key(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return false, fmt.Errorf("mark %s: %w", st.key, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != own.Rev() {
			return false, lock.ErrLost
		}
		return false, nil
	}
	sold, err := unsettledSales(st.sku, []lazySeg{l}, resp.Responses[2].GetResponseRange().GetKvs())
	if err != nil {
		return false, err
	}
	units := c.N - sold[l.index]
	if units < 0 {
		return false, &CorruptError{Key: st.key, Value: value,
			Err: fmt.Errorf("orders since revision %d took %d units from a segment that held %d", l.base, sold[l.index], c.N)}
	}
	in, inMod, err := decodeCounterKV(st.inKey, resp.Responses[1].GetResponseRange())
	if err != nil {
		return false, err
	}
	// Write the exact units at once: a marked counter keeps its old base,
	// and until it is written again every reader of the SKU counts the
	// records since that base, however long this holder leaves it.
	exact, err := e.kv.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(own.Key()), "=", own.Rev()),
		clientv3.Compare(clientv3.ModRevision(st.key), "=", resp.Header.Revision),
	).Then(clientv3.OpPut(st.key, EncodeCounter(units))).Commit()
	if err != nil {
		return false, fmt.Errorf("mark %s: %w", st.key, err)
	}
	if !exact.Succeeded {
		return false, nil // read again: the lock's loss is found there
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token > own.Rev() {
		return false, lock.ErrLost
	}
	if st.token != own.Rev() {
		st.reserved, st.pending = 0, 0
	}
	st.token, st.value, st.modRev, st.stale = own.Rev(), units, exact.Header.Revision, false
	st.inKnown, st.inbox, st.inMod = true, in, inMod
	return true, nil
}

// reads are the Gets that fill the cache: the counter, and a segment's
// inbox.
func (st *placeState) reads() []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpGet(st.key)}
	if st.inKey != "" {
		ops = append(ops, clientv3.OpGet(st.inKey))
	}
	return ops
}

// fill makes the cache valid under own from the answers to reads, read
// while own's key was held (or in the transaction that took it).
func (st *placeState) fill(own *lock.Ownership, rs []*pb.ResponseOp) error {
	v, mod, err := decodeHeldCounterKV(st.key, rs[0].GetResponseRange())
	if err != nil {
		return err
	}
	var in, inMod int64
	if st.inKey != "" {
		if in, inMod, err = decodeCounterKV(st.inKey, rs[1].GetResponseRange()); err != nil {
			return err
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token > own.Rev() {
		return lock.ErrLost
	}
	if st.token != own.Rev() {
		// Reservations made under an older key belong to orders whose
		// commits fail (the key is gone); they do not count here.
		st.reserved, st.pending = 0, 0
	}
	st.token, st.value, st.modRev, st.stale = own.Rev(), v, mod, false
	st.inKnown, st.inbox, st.inMod = st.inKey != "", in, inMod
	return nil
}

// seeInboxLocked records the inbox as read (or written) at revision mod.
// Readers and writers race the committer's absorptions, so a value older
// than the cache's is ignored: applying it would count absorbed units twice.
func (st *placeState) seeInboxLocked(in, mod int64) {
	if !st.inKnown || mod >= st.inMod {
		st.inKnown, st.inbox, st.inMod = true, in, mod
	}
}

// availLocked is what the place can still promise: counter plus known
// inbox, less what is reserved.
func (st *placeState) availLocked() int64 {
	a := st.value - st.reserved
	if st.inKnown {
		a += st.inbox
	}
	return a
}

// reserve sets qty aside for an order under own, if the place has it and
// the cache is valid under own. The reservation ends with unreserve (the
// order failed) or settle (it committed).
func (st *placeState) reserve(own *lock.Ownership, qty int64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token != own.Rev() || st.stale || st.frozen || st.availLocked() < qty {
		return false
	}
	st.reserved += qty
	st.pending++
	return true
}

// unreserve gives back a reservation whose order was not committed.
func (st *placeState) unreserve(own *lock.Ownership, qty int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token != own.Rev() {
		return
	}
	st.reserved -= qty
	st.pending--
	st.quietLocked()
}

// settle records a commit of take units (n reservations) under own at
// revision rev: the counter is now value.
func (st *placeState) settle(own *lock.Ownership, take int64, n int, value, rev int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token != own.Rev() {
		return
	}
	st.value, st.modRev = value, rev
	st.reserved -= take
	st.pending -= n
	st.quietLocked()
}

// absorbed records an absorb under own at revision rev: the counter is now
// value, and the inbox was emptied then. A deposit this process saw land
// after rev (a refill's answer can overtake the absorb's) is kept.
func (st *placeState) absorbed(own *lock.Ownership, value, rev int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token != own.Rev() {
		return
	}
	st.value, st.modRev = value, rev
	if st.inMod <= rev {
		st.inbox, st.inMod = 0, rev
	}
}

func (st *placeState) quietLocked() {
	if st.frozen && st.pending == 0 && st.quiet != nil {
		close(st.quiet)
		st.quiet = nil
	}
}

// quiesce stops new reservations under own and waits until the pending ones
// have resolved, so that a direct write of the counter (a drain) does not
// race the commits of orders that already ran their step. thaw undoes it.
func (st *placeState) quiesce(ctx context.Context, own *lock.Ownership) error {
	st.mu.Lock()
	if st.token != own.Rev() || st.pending == 0 {
		st.frozen = st.token == own.Rev()
		st.mu.Unlock()
		return nil
	}
	st.frozen = true
	if st.quiet == nil {
		st.quiet = make(chan struct{})
	}
	quiet := st.quiet
	st.mu.Unlock()
	select {
	case <-quiet:
		return nil
	case <-ctx.Done():
		st.thaw()
		return context.Cause(ctx)
	}
}

func (st *placeState) thaw() {
	st.mu.Lock()
	st.frozen = false
	st.mu.Unlock()
}

// invalidate drops the cache after a failed compare or an unknown outcome.
func (st *placeState) invalidate() {
	st.mu.Lock()
	st.stale = true
	st.mu.Unlock()
}

// decodeHeldCounterKV decodes a counter read by (or for) its lock's holder:
// errLazyCounter when it is a lazy segment counter with units (they need
// the records: markLazy), else its units.
func decodeHeldCounterKV(key string, r *pb.RangeResponse) (value, modRev int64, err error) {
	kvs := r.GetKvs()
	if len(kvs) == 0 {
		return 0, 0, nil
	}
	if !bytes.HasPrefix(kvs[0].Value, []byte(lazyHead)) {
		v, err := decodeExact(key, kvs[0].Value)
		return v, kvs[0].ModRevision, err
	}
	c, err := DecodeSegmentCounter(key, kvs[0].Value)
	if err != nil {
		return 0, 0, err
	}
	if _, lazy := lazyOf(0, c, kvs[0].ModRevision); lazy {
		return 0, 0, errLazyCounter
	}
	return c.N, kvs[0].ModRevision, nil
}

// decodeCounterKV decodes a counter read with a Get; a missing key is 0
// (counters are created by their first write). A lazy segment counter
// gives its N, an upper bound of its units (DecodeCounter).
func decodeCounterKV(key string, r *pb.RangeResponse) (value, modRev int64, err error) {
	kvs := r.GetKvs()
	if len(kvs) == 0 {
		return 0, 0, nil
	}
	v, err := DecodeCounter(key, kvs[0].Value)
	if err != nil {
		return 0, 0, err
	}
	return v, kvs[0].ModRevision, nil
}
