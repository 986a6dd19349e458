package segments

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/lock"
)

// heldPlace is a place whose lock this goroutine holds, with its counter as
// read under the lock and the change the current operation makes to it. It
// is for the operations that write a place directly under its lock (moves,
// restocks, drains) rather than through the committer.
type heldPlace struct {
	e  *Engine
	st *placeState
	h  *lock.Hold

	value, modRev int64 // the counter
	inboxRead     bool
	inbox, inMod  int64 // the inbox, when read
	delta         int64 // added to the counter by this operation (negative: taken)
}

// lockPlace acquires p's lock. wait < 0 waits as long as ctx allows.
func (e *Engine) lockPlace(ctx context.Context, sku string, p Place, wait time.Duration) (*heldPlace, error) {
	kind := lock.KindSegment
	if p.IsPool() {
		kind = lock.KindPool
	} else {
		// A segment of a SKU this process sells goes through its seller's
		// queue (made now if it was not), so that the lock is kept as the
		// seller's tenure afterwards, as its own acquisitions are.
		e.mu.Lock()
		s := e.sellers[sku]
		e.mu.Unlock()
		if s != nil && p.Index() < len(s.qs) {
			_, _ = s.queue(p.Index())
		}
	}
	h, err := e.locks.Acquire(ctx, e.placeLock(sku, p), kind, wait)
	if err != nil {
		return nil, err
	}
	return &heldPlace{e: e, st: e.placeState(sku, p), h: h}, nil
}

func (hp *heldPlace) unlock() {
	// Unlock with a fresh context: the caller's may be the reason we stop.
	_ = hp.h.Unlock(hp.e.bg.Ctx())
}

// load copies the cache (reading etcd when it is not valid under this
// hold) and resets the operation's change. With inbox it also counts the
// segment's inbox, read now, in available().
func (hp *heldPlace) load(ctx context.Context, inbox bool) error {
	hp.delta = 0
	hp.inboxRead = false
	st := hp.st
	if err := st.ensure(ctx, hp.e, hp.h.Own()); err != nil {
		return err
	}
	if inbox && st.inKey != "" {
		// Others add to the inbox: read its current value.
		resp, err := hp.e.kv.Get(ctx, st.inKey)
		if err != nil {
			return fmt.Errorf("read %s: %w", st.inKey, err)
		}
		in, inMod, err := decodeCounterKV(st.inKey, &pb.RangeResponse{Kvs: resp.Kvs})
		if err != nil {
			return err
		}
		st.mu.Lock()
		if st.token == hp.h.Own().Rev() {
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
	if hp.st.token != hp.h.Own().Rev() {
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
		hp.h.IsOwner(),
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
	ops := []clientv3.Op{clientv3.OpPut(hp.st.key, EncodeCounter(hp.newValue()))}
	if hp.absorbs() {
		ops = append(ops, clientv3.OpPut(hp.st.inKey, EncodeCounter(0)))
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
	if st.token == hp.h.Own().Rev() {
		st.value, st.modRev = hp.value, rev
		if absorbed {
			st.inbox, st.inMod = 0, rev
		}
	}
	st.mu.Unlock()
}

// invalidate drops the cache after a failed compare or an unknown outcome.
func (hp *heldPlace) invalidate() { hp.st.invalidate() }

// stillOwned reads a diagnostic Get of a hold's lock key.
func stillOwned(r *pb.ResponseOp, hp *heldPlace) bool {
	kvs := r.GetResponseRange().GetKvs()
	return len(kvs) > 0 && kvs[0].CreateRevision == hp.h.Own().Rev()
}
