package segments

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/stockctl/stockctl/internal/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Refill moves stock from sku's pool into segments: want[i] units into
// segment i, fewer if the pool holds less (segments served in index order).
// The stock lands in each segment's inbox, which counts as the segment's
// stock at once and is absorbed into its counter by the next allocation
// that needs it; so Refill takes only the pool's lock and never waits
// behind a busy segment's queue.
//
// The move is fenced by the pool's lock and by fence (the rebalancer
// passes its leadership compare); it is one transaction, or one per group
// of segments that fits etcd's --max-txn-ops (WithMaxTxnOps). It returns what was moved into
// each segment and the commit revision; with nothing to move (an empty
// pool) it returns an empty map and revision 0. Once the transaction is
// sent, cancelling ctx does not abandon it: Refill waits for etcd's answer
// (at most the commit timeout), so an error means nothing moved unless
// etcd could not be reached at all.
func (e *Engine) Refill(ctx context.Context, sku string, want map[int]int64, fence ...clientv3.Cmp) (map[int]int64, int64, error) {
	return e.refill(ctx, sku, want, 0, -1, nil, fence)
}

// RefillBelow is Refill of only those segments of want whose stock (counter
// plus inbox), read in the move's own transaction, is below threshold. A
// decision made on an earlier read (the rebalancer's view) can be overtaken
// by a seller's pull or a release meanwhile; this one cannot: the inbox's
// revision is compared, and while a segment is held its counter only falls.
// It waits at most wait for the pool's lock (wait < 0: as long as ctx
// allows), then gives up with ErrLocked, having moved nothing.
func (e *Engine) RefillBelow(ctx context.Context, sku string, want map[int]int64, threshold int64, wait time.Duration, fence ...clientv3.Cmp) (map[int]int64, int64, error) {
	if threshold <= 0 {
		return nil, 0, fmt.Errorf("refill %s: %w: threshold %d must be positive", sku, ErrInvalid, threshold)
	}
	return e.refill(ctx, sku, want, threshold, wait, nil, fence)
}

// refill is Refill; below > 0 skips segments holding at least below; wait
// bounds the wait for the pool's lock (lockPlace); note, if set, returns
// puts to add to the move's transaction given what it moves (a seller's
// pull record).
func (e *Engine) refill(ctx context.Context, sku string, want map[int]int64, below int64, wait time.Duration, note func(moved map[int]int64) []clientv3.Op, fence []clientv3.Cmp) (out map[int]int64, outRev int64, outErr error) {
	if e.metrics != nil {
		kind := moveRefill
		if note != nil {
			kind = movePull // only a seller's pull notes what it moved
		}
		defer func(start time.Time) { e.metrics.moved(kind, sku, out, time.Since(start), outErr) }(time.Now())
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return nil, 0, fmt.Errorf("refill %s: %w", sku, err)
	}
	targets := slices.Sorted(maps.Keys(want))
	for _, i := range targets {
		if i < 0 || i >= info.segments || want[i] < 0 || want[i] > MaxTotal {
			return nil, 0, fmt.Errorf("refill %s: %w: %d units into segment %d of %d", sku, ErrInvalid, want[i], i, info.segments)
		}
	}
	pool, err := e.lockPlace(ctx, sku, Pool, wait)
	if err != nil {
		return nil, 0, fmt.Errorf("refill %s: %w", sku, err)
	}
	defer pool.unlock()
	// The SKU must still be the one whose segments were counted: a stale
	// view of a SKU deleted and created again would move its pool's stock
	// into segments it does not have.
	fence = append(slices.Clone(fence), e.incarnation(info)...)

	// Each transaction reads two keys and compares one per segment, on top
	// of the pool's and the fence's compares: as many segments as fit
	// --max-txn-ops go together, all under the one pool lock.
	per := max(1, (e.cfg.MaxTxnOps-4-len(fence))/2)
	moved := map[int]int64{}
	var rev int64
	for len(targets) > 0 {
		chunk := targets[:min(per, len(targets))]
		targets = targets[len(chunk):]
		m, r, err := e.refillChunk(ctx, info, pool, chunk, want, below, note, fence)
		if err != nil {
			return nil, 0, err
		}
		maps.Copy(moved, m)
		rev = max(rev, r)
	}
	return moved, rev, nil
}

// refillChunk is one transaction of refill, for targets.
func (e *Engine) refillChunk(ctx context.Context, info *skuInfo, pool *heldPlace, targets []int, want map[int]int64, below int64, note func(moved map[int]int64) []clientv3.Op, fence []clientv3.Cmp) (map[int]int64, int64, error) {
	sku := info.name
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		if err := pool.load(ctx, false); err != nil {
			return nil, 0, fmt.Errorf("refill %s: %w", sku, err)
		}
		reads := make([]clientv3.Op, 0, 2*len(targets))
		for _, i := range targets {
			reads = append(reads, clientv3.OpGet(e.keys.Inbox(sku, i)), clientv3.OpGet(e.keys.Segment(sku, i)))
		}
		inboxes, err := e.kv.Txn(ctx).Then(reads...).Commit()
		if err != nil {
			return nil, 0, fmt.Errorf("refill %s: %w", sku, err)
		}
		moved, newIn := map[int]int64{}, map[int]int64{}
		cmps := append(pool.cmps(), fence...)
		var ops []clientv3.Op
		left := pool.value
		for j, i := range targets {
			key := e.keys.Inbox(sku, i)
			in, mod, err := decodeCounterKV(key, inboxes.Responses[2*j].GetResponseRange())
			if err != nil {
				return nil, 0, fmt.Errorf("refill %s: %w", sku, err)
			}
			counter, _, err := decodeCounterKV(e.keys.Segment(sku, i), inboxes.Responses[2*j+1].GetResponseRange())
			if err != nil {
				return nil, 0, fmt.Errorf("refill %s: %w", sku, err)
			}
			if below > 0 && counter+in >= below {
				continue
			}
			q := min(want[i], left)
			if q <= 0 {
				continue
			}
			left -= q
			moved[i], newIn[i] = q, in+q
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", mod))
			ops = append(ops, clientv3.OpPut(key, EncodeCounter(in+q)))
		}
		if len(ops) == 0 {
			return moved, 0, nil
		}
		pool.delta = left - pool.value
		ops = append(ops, pool.ops()...)
		if note != nil {
			ops = append(ops, note(moved)...)
		}
		resp, err := e.commitMove(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return e.kv.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(pool.h.Own().Key())).Commit()
		})
		if err != nil {
			pool.invalidate()
			return nil, 0, fmt.Errorf("refill %s: %w", sku, err)
		}
		if resp.Succeeded {
			pool.committed(resp.Header.Revision)
			for i, in := range newIn {
				// A seller of this process sees the stock without a read
				// (a direct order's pull counts on it: the cache is made
				// here if the seller had not made it yet).
				st := e.placeState(sku, Segment(i))
				st.mu.Lock()
				if st.token != 0 {
					st.seeInboxLocked(in, resp.Header.Revision)
				}
				st.seeDirectInboxLocked(in, resp.Header.Revision)
				st.mu.Unlock()
			}
			return moved, resp.Header.Revision, nil
		}
		if !stillOwned(resp.Responses[0], pool) {
			return nil, 0, fmt.Errorf("refill %s: %w", sku, lock.ErrLost)
		}
		if err := e.skuChanged(ctx, info); err != nil {
			return nil, 0, fmt.Errorf("refill: %w", err)
		}
		if err := e.checkFence(ctx, fence); err != nil {
			return nil, 0, fmt.Errorf("refill %s: %w", sku, err)
		}
		pool.invalidate() // an inbox was absorbed meanwhile: read again
	}
	return nil, 0, fmt.Errorf("refill %s: %w", sku, errContention)
}

// Drain moves all of segment seg's stock (its counter and inbox) back to
// sku's pool, in one transaction fenced by the pool's lock, the segment's
// lock and fence. It takes the pool's lock and then waits at most wait for
// the segment's (the global lock order); a segment busy for that long is
// not idle, and Drain returns ErrLocked without moving anything. As with
// Refill, a sent transaction is not abandoned when ctx is cancelled.
func (e *Engine) Drain(ctx context.Context, sku string, seg int, wait time.Duration, fence ...clientv3.Cmp) (out int64, outRev int64, outErr error) {
	if e.metrics != nil {
		defer func(start time.Time) {
			var moved map[int]int64
			if out > 0 {
				moved = map[int]int64{seg: out}
			}
			e.metrics.moved(moveDrain, sku, moved, time.Since(start), outErr)
		}(time.Now())
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		return 0, 0, fmt.Errorf("drain %s: %w", sku, err)
	}
	if seg < 0 || seg >= info.segments {
		return 0, 0, fmt.Errorf("drain %s: %w: segment %d of %d", sku, ErrInvalid, seg, info.segments)
	}
	pool, err := e.lockPlace(ctx, sku, Pool, -1)
	if err != nil {
		return 0, 0, fmt.Errorf("drain %s: %w", sku, err)
	}
	defer pool.unlock()
	fence = append(slices.Clone(fence), e.incarnation(info)...)
	sp, err := e.lockPlace(ctx, sku, Segment(seg), wait)
	if err != nil {
		return 0, 0, fmt.Errorf("drain %s segment %d: %w", sku, seg, err)
	}
	defer func() {
		// A drained segment is empty: a seller of this process keeping
		// its key as a tenure would sell nothing from it, and would keep
		// other processes from selling it directly (tryDirect).
		q, own := sp.h.Queue(), sp.h.Own()
		sp.unlock()
		q.Yield(own)
	}()
	// Orders of this process that ran their step there are still being
	// committed: let them land before taking everything.
	if err := sp.st.quiesce(ctx, sp.h.Own()); err != nil {
		return 0, 0, fmt.Errorf("drain %s segment %d: %w", sku, seg, err)
	}
	defer sp.st.thaw()

	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		if err := pool.load(ctx, false); err != nil {
			return 0, 0, fmt.Errorf("drain %s: %w", sku, err)
		}
		if err := sp.load(ctx, true); err != nil {
			return 0, 0, fmt.Errorf("drain %s: %w", sku, err)
		}
		moved := sp.available()
		if moved == 0 {
			return 0, 0, nil
		}
		sp.delta, pool.delta = -moved, moved
		cmps := append(append(pool.cmps(), sp.cmps()...), fence...)
		ops := append(pool.ops(), sp.ops()...)
		resp, err := e.commitMove(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return e.kv.Txn(ctx).If(cmps...).Then(ops...).
				Else(clientv3.OpGet(pool.h.Own().Key()), clientv3.OpGet(sp.h.Own().Key())).Commit()
		})
		if err != nil {
			pool.invalidate()
			sp.invalidate()
			return 0, 0, fmt.Errorf("drain %s: %w", sku, err)
		}
		if resp.Succeeded {
			pool.committed(resp.Header.Revision)
			sp.committed(resp.Header.Revision)
			return moved, resp.Header.Revision, nil
		}
		if !stillOwned(resp.Responses[0], pool) || !stillOwned(resp.Responses[1], sp) {
			return 0, 0, fmt.Errorf("drain %s: %w", sku, lock.ErrLost)
		}
		if err := e.skuChanged(ctx, info); err != nil {
			return 0, 0, fmt.Errorf("drain: %w", err)
		}
		if err := e.checkFence(ctx, fence); err != nil {
			return 0, 0, fmt.Errorf("drain %s: %w", sku, err)
		}
		pool.invalidate()
		sp.invalidate()
	}
	return 0, 0, fmt.Errorf("drain %s: %w", sku, errContention)
}
