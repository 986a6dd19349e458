package rebalance

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// view is the leader's picture of one SKU, kept current by watch events.
// Each counter remembers the revision it was read at, so that a late event
// never overwrites a newer value (the leader's own moves update the view
// before their events arrive).
type view struct {
	sku  string
	meta segments.Meta

	pool, poolRev int64
	seg, segRev   []int64
	in, inRev     []int64

	changed   []time.Time // when the segment's stock last changed
	below     []bool      // the segment was below its threshold at the last look
	crossedAt []time.Time // when it went below (zero: unknown, e.g. found by a sweep)
	crossRev  []int64
	parked    []bool // drained, or dry, for idleness; not refilled until a restock or a change by others
	// drainPending: a consolidation's drain of the segment found its lock
	// busy. It is drained once idle, although the pool holds stock by then
	// (another segment's drain filled it): consolidation runs only while
	// the pool is empty, and without this the segment's units stayed there.
	drainPending []bool

	// forceIdle counts every segment whose lock is free as idle (RunOnce,
	// which has no history to judge idleness by).
	forceIdle bool
}

func newView(sku string, meta segments.Meta, now time.Time) *view {
	n := meta.Segments
	v := &view{sku: sku, meta: meta,
		seg: make([]int64, n), segRev: make([]int64, n), in: make([]int64, n), inRev: make([]int64, n),
		changed: make([]time.Time, n), below: make([]bool, n), crossedAt: make([]time.Time, n),
		crossRev: make([]int64, n), parked: make([]bool, n), drainPending: make([]bool, n)}
	for i := range v.changed {
		v.changed[i] = now
	}
	return v
}

func (v *view) avail(i int) int64 { return v.seg[i] + v.in[i] }

// anyDry reports whether some segment holds nothing. A parked dry segment
// counts too: a stocked segment that was busy (its lock held) when the dry
// ones went idle and were parked must still be drained once it is idle.
// Counting only unparked dry segments stranded its units there for good
// (found on a busy machine: the drain lost the race for the lock of a
// process that had just closed, the dry segments were parked in the same
// pass, and no pass drained again).
func (v *view) anyDry() bool {
	for i := range v.seg {
		if v.avail(i) == 0 {
			return true
		}
	}
	return false
}

// threshold: a segment below it needs a refill. With no watermark, only an
// empty segment does.
func (v *view) threshold() int64 { return max(v.meta.LowWatermark, 1) }

// set applies a counter value read or watched at rev; older values are ignored.
func (v *view) set(k keys.StockKey, value, rev int64, now time.Time) {
	switch k.Kind {
	case keys.KindPool:
		if rev > v.poolRev {
			v.pool, v.poolRev = value, rev
		}
		return
	case keys.KindSegment:
		if rev <= v.segRev[k.Index] {
			return
		}
		v.seg[k.Index], v.segRev[k.Index] = value, rev
	case keys.KindInbox:
		if rev <= v.inRev[k.Index] {
			return
		}
		v.in[k.Index], v.inRev[k.Index] = value, rev
	}
	// A change this leader did not make (its own moves set the revisions
	// first): someone sells here again, or stock came back to it.
	v.parked[k.Index] = false
	v.changed[k.Index] = now
	v.observe(k.Index, rev, now)
}

// observe notes whether segment i crossed below its threshold.
func (v *view) observe(i int, rev int64, now time.Time) {
	below := v.avail(i) < v.threshold()
	if below && !v.below[i] {
		v.crossedAt[i], v.crossRev[i] = now, rev
	}
	if !below {
		v.crossedAt[i], v.crossRev[i] = time.Time{}, 0
	}
	v.below[i] = below
}

// loadAll reads every SKU's meta record and counters at one revision.
func (l *leadership) loadAll(ctx context.Context) (map[string]*view, int64, error) {
	k := l.c.keys
	resp, err := l.c.kv.Txn(ctx).Then(
		clientv3.OpGet(k.MetaPrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(k.StockPrefix(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("load SKUs: %w", err)
	}
	now := time.Now()
	views := map[string]*view{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if v := l.viewFromMeta(kv, now); v != nil {
			views[v.sku] = v
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		applyStock(k, views, kv, now)
	}
	return views, resp.Header.Revision, nil
}

// sweepSKUs is how many SKUs one safety-net sweep reads again: the sweeps
// go round the SKUs this many at a time, so that a leader of thousands of
// SKUs reads a bounded slice of them each tick rather than all of them.
const sweepSKUs = 64

// loadSome reads the named SKUs again, each at one revision (one
// transaction for all of them: two ranges each); a SKU missing from the
// result no longer exists (or is being created).
func (l *leadership) loadSome(ctx context.Context, skus []string) (map[string]*view, error) {
	k := l.c.keys
	ops := make([]clientv3.Op, 0, 2*len(skus))
	for _, sku := range skus {
		ops = append(ops, clientv3.OpGet(k.Meta(sku)), clientv3.OpGet(k.SKUStock(sku), clientv3.WithPrefix()))
	}
	resp, err := l.c.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("load SKUs: %w", err)
	}
	now := time.Now()
	views := map[string]*view{}
	for i := range skus {
		if kvs := resp.Responses[2*i].GetResponseRange().Kvs; len(kvs) > 0 {
			if v := l.viewFromMeta(kvs[0], now); v != nil {
				views[v.sku] = v
			}
		}
		for _, kv := range resp.Responses[2*i+1].GetResponseRange().Kvs {
			applyStock(k, views, kv, now)
		}
	}
	return views, nil
}

// load reads one SKU.
func (l *leadership) load(ctx context.Context, sku string) (*view, error) {
	k := l.c.keys
	resp, err := l.c.kv.Txn(ctx).Then(
		clientv3.OpGet(k.Meta(sku)),
		clientv3.OpGet(k.SKUStock(sku), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", sku, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, fmt.Errorf("%w %q", errUnknownSKU, sku)
	}
	now := time.Now()
	v := l.viewFromMeta(kvs[0], now)
	if v == nil {
		return nil, fmt.Errorf("%w %q (corrupt or still being created)", errUnknownSKU, sku)
	}
	views := map[string]*view{sku: v}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		applyStock(k, views, kv, now)
	}
	return v, nil
}

func (l *leadership) viewFromMeta(kv *mvccpb.KeyValue, now time.Time) *view {
	sku, err := l.c.keys.ParseMeta(string(kv.Key))
	if err != nil {
		return nil
	}
	meta, err := segments.DecodeMeta(string(kv.Key), kv.Value)
	if err != nil || meta.Creating {
		return nil
	}
	return newView(sku, meta, now)
}

// applyStock applies one counter (from a read or a PUT event) to its view.
// Keys of unknown SKUs, segments beyond the count and undecodable values are
// skipped: the allocations that meet them report them.
func applyStock(k keys.Space, views map[string]*view, kv *mvccpb.KeyValue, now time.Time) *view {
	sk, err := k.ParseStock(string(kv.Key))
	if err != nil {
		return nil
	}
	v := views[sk.SKU]
	if v == nil || sk.Index >= v.meta.Segments {
		return nil
	}
	value := int64(0)
	if len(kv.Value) > 0 { // a DELETE event carries no value: the counter is 0
		if value, err = segments.DecodeCounter(string(kv.Key), kv.Value); err != nil {
			return nil
		}
	}
	v.set(sk, value, kv.ModRevision, now)
	return v
}
