package segments

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SetPolicy changes sku's refill policy mid-sale: the low watermark below
// which the rebalancer refills a segment, and the refill batch it moves (0:
// DefaultRefillBatch of the total and segment count); a negative value
// keeps the current one. It rewrites the meta
// record under a compare of its revision, so that a concurrent restock is
// neither lost nor undone (it reads again and retries), and returns the new
// record.
//
// The elected rebalancer watches meta records and applies the policy from
// its next decision on. A selling process that finds no stock in its
// segments pulls from the pool at least the refill batch it read first,
// until it restarts (the engine caches it with the segment count).
// Total, segment count and per-user limit do not change.
func (e *Engine) SetPolicy(ctx context.Context, sku string, lowWatermark, refillBatch int64) (Meta, error) {
	if err := ValidateSKU(sku); err != nil {
		return Meta{}, fmt.Errorf("set the policy of %s: %w", sku, err)
	}
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		meta, rev, err := e.Meta(ctx, sku)
		if err != nil {
			return Meta{}, fmt.Errorf("set the policy of %s: %w", sku, err)
		}
		if lowWatermark >= 0 {
			meta.LowWatermark = lowWatermark
		}
		switch {
		case refillBatch == 0:
			meta.RefillBatch = DefaultRefillBatch(meta.Total, meta.Segments)
		case refillBatch > 0:
			meta.RefillBatch = refillBatch
		}
		meta.InitialFill = 0 // the record's revision no longer dates the fill (Meta.InitialFill)
		if err := meta.Validate(); err != nil {
			return Meta{}, fmt.Errorf("set the policy of %s: %w", sku, err)
		}
		key := e.keys.Meta(sku)
		resp, err := e.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, EncodeMeta(meta))).
			Commit()
		if err != nil {
			return Meta{}, fmt.Errorf("set the policy of %s: %w", sku, err)
		}
		if resp.Succeeded {
			return meta, nil
		}
	}
	return Meta{}, fmt.Errorf("set the policy of %s: %w", sku, errContention)
}
