package coordinator

import (
	"context"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/segments"
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
	place segments.Place
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
}

func (c *Coordinator) placeState(sku string, p segments.Place) *placeState {
	c.stock.mu.Lock()
	defer c.stock.mu.Unlock()
	id := placeID{sku, p}
	st := c.stock.places[id]
	if st == nil {
		st = &placeState{sku: sku, place: p, key: c.counterKey(sku, p)}
		if !p.IsPool() {
			st.inKey = c.keys.Inbox(sku, p.Index())
		}
		c.stock.places[id] = st
	}
	return st
}

func (c *Coordinator) counterKey(sku string, p segments.Place) string {
	if p.IsPool() {
		return c.keys.Pool(sku)
	}
	return c.keys.Segment(sku, p.Index())
}

func (c *Coordinator) placeLock(sku string, p segments.Place) string {
	if p.IsPool() {
		return c.keys.PoolLock(sku)
	}
	return c.keys.SegmentLock(sku, p.Index())
}

// ensure makes the cache valid under own (the caller holds own's key, as a
// hold or a tenure): it reads the counter and inbox if the cache was filled
// under another key, or if a commit's outcome is unknown.
func (st *placeState) ensure(ctx context.Context, c *Coordinator, own *ownership) error {
	// Create revisions grow with every new key: a cache filled under a
	// newer key than own means own is gone, and must not be loaded back
	// (that would drop the newer key's reservations).
	check := func() (bool, error) {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.token > own.rev {
			return false, ErrLockLost
		}
		return st.token == own.rev && !st.stale, nil
	}
	if ok, err := check(); ok || err != nil {
		return err
	}
	st.loadMu.Lock()
	defer st.loadMu.Unlock()
	if ok, err := check(); ok || err != nil {
		return err
	}
	ops := []clientv3.Op{clientv3.OpGet(st.key)}
	if st.inKey != "" {
		ops = append(ops, clientv3.OpGet(st.inKey))
	}
	resp, err := c.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("read %s: %w", st.key, err)
	}
	v, mod, err := decodeCounterKV(st.key, resp.Responses[0].GetResponseRange())
	if err != nil {
		return err
	}
	var in, inMod int64
	if st.inKey != "" {
		if in, inMod, err = decodeCounterKV(st.inKey, resp.Responses[1].GetResponseRange()); err != nil {
			return err
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token > own.rev {
		return ErrLockLost
	}
	if st.token != own.rev {
		// Reservations made under an older key belong to orders whose
		// commits fail (the key is gone); they do not count here.
		st.reserved, st.pending = 0, 0
	}
	st.token, st.value, st.modRev, st.stale = own.rev, v, mod, false
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
func (st *placeState) reserve(own *ownership, qty int64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token != own.rev || st.stale || st.frozen || st.availLocked() < qty {
		return false
	}
	st.reserved += qty
	st.pending++
	return true
}

// unreserve gives back a reservation whose order was not committed.
func (st *placeState) unreserve(own *ownership, qty int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token != own.rev {
		return
	}
	st.reserved -= qty
	st.pending--
	st.quietLocked()
}

// settle records a commit of take units (n reservations) under own at
// revision rev: the counter is now value, and the inbox was absorbed (set to
// 0) if absorbed.
func (st *placeState) settle(own *ownership, take int64, n int, value, rev int64, absorbed bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.token != own.rev {
		return
	}
	st.value, st.modRev = value, rev
	if absorbed {
		st.inbox, st.inMod = 0, rev
	}
	st.reserved -= take
	st.pending -= n
	st.quietLocked()
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
func (st *placeState) quiesce(ctx context.Context, own *ownership) error {
	st.mu.Lock()
	if st.token != own.rev || st.pending == 0 {
		st.frozen = st.token == own.rev
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

// heldPlace is a place whose lock this goroutine holds, with its counter as
// read under the lock and the change the current operation makes to it. It
// is for the operations that write a place directly under its lock (moves,
// restocks, drains) rather than through the committer.
type heldPlace struct {
	c  *Coordinator
	st *placeState
	h  *hold

	value, modRev int64 // the counter
	inboxRead     bool
	inbox, inMod  int64 // the inbox, when read
	delta         int64 // added to the counter by this operation (negative: taken)
}

// lockPlace acquires p's lock. wait < 0 waits as long as ctx allows; abort
// may be nil.
func (c *Coordinator) lockPlace(ctx context.Context, sku string, p segments.Place, wait time.Duration, abort <-chan struct{}) (*heldPlace, error) {
	h, err := c.lockPrefix(ctx, c.placeLock(sku, p), wait, abort)
	if err != nil {
		return nil, err
	}
	return &heldPlace{c: c, st: c.placeState(sku, p), h: h}, nil
}

func (hp *heldPlace) place() segments.Place { return hp.st.place }

func (hp *heldPlace) unlock() {
	// Unlock with a fresh context: the caller's may be the reason we stop.
	_ = hp.h.unlock(hp.c.bgCtx)
}

// load copies the cache (reading etcd when it is not valid under this
// hold) and resets the operation's change. With inbox it also counts the
// segment's inbox, read now, in available().
func (hp *heldPlace) load(ctx context.Context, inbox bool) error {
	hp.delta = 0
	hp.inboxRead = false
	st := hp.st
	if err := st.ensure(ctx, hp.c, hp.h.own); err != nil {
		return err
	}
	if inbox && st.inKey != "" {
		// Others add to the inbox: read its current value.
		resp, err := hp.c.kv.Get(ctx, st.inKey)
		if err != nil {
			return fmt.Errorf("read %s: %w", st.inKey, err)
		}
		in, inMod, err := decodeCounterKV(st.inKey, &pb.RangeResponse{Kvs: resp.Kvs})
		if err != nil {
			return err
		}
		st.mu.Lock()
		if st.token == hp.h.own.rev {
			st.seeInboxLocked(in, inMod)
		}
		st.mu.Unlock()
		hp.inbox, hp.inMod, hp.inboxRead = in, inMod, true
	}
	st.mu.Lock()
	hp.value, hp.modRev = st.value, st.modRev
	st.mu.Unlock()
	return nil
}

// available is what the place can give: its counter plus, when read, its
// inbox, less what this process's pending orders reserved there.
func (hp *heldPlace) available() int64 {
	hp.st.mu.Lock()
	reserved := hp.st.reserved
	if hp.st.token != hp.h.own.rev {
		reserved = 0
	}
	hp.st.mu.Unlock()
	a := hp.value - reserved
	if hp.inboxRead {
		a += hp.inbox
	}
	return a
}

// cmps are the conditions under which the operation's writes are valid:
// the lock is still held, and the counter (and inbox, when absorbed) are
// as read.
func (hp *heldPlace) cmps() []clientv3.Cmp {
	cmps := []clientv3.Cmp{
		hp.h.isOwner(),
		clientv3.Compare(clientv3.ModRevision(hp.st.key), "=", hp.modRev),
	}
	if hp.absorbs() {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(hp.st.inKey), "=", hp.inMod))
	}
	return cmps
}

// absorbs reports whether the operation moves the inbox into the counter:
// only when it takes more than the counter alone holds, so that the
// rebalancer's deposits and ordinary allocations rarely touch the same key.
func (hp *heldPlace) absorbs() bool {
	return hp.inboxRead && hp.inbox > 0 && hp.value+hp.delta < 0
}

// newValue is the counter after the operation.
func (hp *heldPlace) newValue() int64 {
	if hp.absorbs() {
		return hp.value + hp.inbox + hp.delta
	}
	return hp.value + hp.delta
}

// ops are the operation's writes to the place (none if it changes nothing).
func (hp *heldPlace) ops() []clientv3.Op {
	if hp.delta == 0 {
		return nil
	}
	ops := []clientv3.Op{clientv3.OpPut(hp.st.key, segments.EncodeCounter(hp.newValue()))}
	if hp.absorbs() {
		ops = append(ops, clientv3.OpPut(hp.st.inKey, segments.EncodeCounter(0)))
	}
	return ops
}

// committed records a successful write at rev in the cache.
func (hp *heldPlace) committed(rev int64) {
	if hp.delta == 0 {
		return
	}
	absorbed := hp.absorbs()
	hp.value, hp.modRev = hp.newValue(), rev
	if absorbed {
		hp.inbox, hp.inMod = 0, rev
	}
	hp.delta = 0
	st := hp.st
	st.mu.Lock()
	if st.token == hp.h.own.rev {
		st.value, st.modRev = hp.value, rev
		if absorbed {
			st.inbox, st.inMod = 0, rev
		}
	}
	st.mu.Unlock()
}

// invalidate drops the cache after a failed compare or an unknown outcome.
func (hp *heldPlace) invalidate() { hp.st.invalidate() }

func (st *placeState) invalidate() {
	st.mu.Lock()
	st.stale = true
	st.mu.Unlock()
}

// decodeCounterKV decodes a counter read with a Get; a missing key is 0
// (counters are created by their first write).
func decodeCounterKV(key string, r *pb.RangeResponse) (value, modRev int64, err error) {
	kvs := r.GetKvs()
	if len(kvs) == 0 {
		return 0, 0, nil
	}
	v, err := segments.DecodeCounter(key, kvs[0].Value)
	if err != nil {
		return 0, 0, err
	}
	return v, kvs[0].ModRevision, nil
}
