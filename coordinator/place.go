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
// its segments): a cache of its counter and the queue of plain allocations
// waiting to be committed there together (see groupcommit.go).
//
// The cache is read and written only by the goroutine holding the place's
// lock, and is valid only under the same etcd key it was filled under
// (token): while this process kept the key, nobody else could write the
// counter. Every write still compares the counter's ModRevision, so a stale
// cache can cost a retry, never a wrong write.
type placeState struct {
	sku   string
	place segments.Place

	token  int64 // fencing token the cache was filled under; 0 = empty
	value  int64
	modRev int64

	mu      sync.Mutex
	pending []*pendingAlloc
}

func (c *Coordinator) placeState(sku string, p segments.Place) *placeState {
	c.stock.mu.Lock()
	defer c.stock.mu.Unlock()
	id := placeID{sku, p}
	st := c.stock.places[id]
	if st == nil {
		st = &placeState{sku: sku, place: p}
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

// heldPlace is a place whose lock this goroutine holds, with its counter as
// read under the lock and the change the current operation makes to it.
type heldPlace struct {
	c     *Coordinator
	st    *placeState
	h     *hold
	key   string
	inKey string // the segment's inbox; "" for the pool

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
	hp := &heldPlace{c: c, st: c.placeState(sku, p), h: h, key: c.counterKey(sku, p)}
	if !p.IsPool() {
		hp.inKey = c.keys.Inbox(sku, p.Index())
	}
	return hp, nil
}

func (hp *heldPlace) place() segments.Place { return hp.st.place }

func (hp *heldPlace) unlock() {
	// Unlock with a fresh context: the caller's may be the reason we stop.
	_ = hp.h.unlock(hp.c.bgCtx)
}

// load reads the counter (from the cache when it is valid under this hold's
// token) and resets the operation's change. With inbox it also reads the
// segment's inbox, so that available() counts stock the rebalancer moved in.
func (hp *heldPlace) load(ctx context.Context, inbox bool) error {
	hp.delta = 0
	hp.inboxRead = false
	st := hp.st
	cached := st.token != 0 && st.token == hp.h.own.rev
	if cached && !(inbox && hp.inKey != "") {
		hp.value, hp.modRev = st.value, st.modRev
		return nil
	}
	ops := []clientv3.Op{clientv3.OpGet(hp.key)}
	if inbox && hp.inKey != "" {
		ops = append(ops, clientv3.OpGet(hp.inKey))
	}
	resp, err := hp.c.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("read %s: %w", hp.key, err)
	}
	v, mod, err := decodeCounterKV(hp.key, resp.Responses[0].GetResponseRange())
	if err != nil {
		return err
	}
	hp.value, hp.modRev = v, mod
	st.token, st.value, st.modRev = hp.h.own.rev, v, mod
	if len(ops) == 2 {
		hp.inbox, hp.inMod, err = decodeCounterKV(hp.inKey, resp.Responses[1].GetResponseRange())
		if err != nil {
			return err
		}
		hp.inboxRead = true
	}
	return nil
}

// available is what the place can give: its counter plus, when read, its inbox.
func (hp *heldPlace) available() int64 {
	if hp.inboxRead {
		return hp.value + hp.inbox
	}
	return hp.value
}

// cmps are the conditions under which the operation's writes are valid:
// the lock is still held, and the counter (and inbox, when absorbed) are
// as read.
func (hp *heldPlace) cmps() []clientv3.Cmp {
	cmps := []clientv3.Cmp{
		hp.h.isOwner(),
		clientv3.Compare(clientv3.ModRevision(hp.key), "=", hp.modRev),
	}
	if hp.absorbs() {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(hp.inKey), "=", hp.inMod))
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
	ops := []clientv3.Op{clientv3.OpPut(hp.key, segments.EncodeCounter(hp.newValue()))}
	if hp.absorbs() {
		ops = append(ops, clientv3.OpPut(hp.inKey, segments.EncodeCounter(0)))
	}
	return ops
}

// committed records a successful write at rev in the cache.
func (hp *heldPlace) committed(rev int64) {
	if hp.delta == 0 {
		return
	}
	hp.value, hp.modRev = hp.newValue(), rev
	if hp.absorbs() {
		hp.inbox, hp.inMod = 0, rev
	}
	hp.delta = 0
	hp.st.token, hp.st.value, hp.st.modRev = hp.h.own.rev, hp.value, rev
}

// invalidate drops the cache after a failed compare.
func (hp *heldPlace) invalidate() { hp.st.token = 0 }

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
