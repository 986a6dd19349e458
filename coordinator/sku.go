package coordinator

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/segments"
)

// SKUConfig describes a SKU to create.
type SKUConfig struct {
	// Total is the stock put in at creation, 0 to segments.MaxTotal.
	Total int64
	// Segments is the number of segments, 1 to segments.MaxSegments. It
	// cannot change later: it is part of every request's routing.
	Segments int
	// InitialFill is how much of Total starts in the segments, spread
	// evenly (the first Total%Segments segments get one more); the rest
	// starts in the central pool, for the rebalancer to hand out. 0 puts
	// everything in the pool; Total puts nothing there.
	InitialFill int64
	// LowWatermark: the rebalancer refills a segment whose stock falls
	// below it (and always refills an empty one).
	LowWatermark int64
	// RefillBatch is how much the rebalancer moves into a segment at once;
	// 0 means DefaultRefillBatch(Total, Segments).
	RefillBatch int64
	// PerUserLimit is the most units one buyer may hold at once, counting
	// confirmed and live reserved orders (Allocate and Reserve with
	// WithBuyer); 0 means no limit. With a limit, every order must name its
	// buyer. It cannot change later. Cost: each order also writes its
	// buyer's counter in its commit (one compare and one put per buyer per
	// group commit); without a limit nothing is written.
	PerUserLimit int64
}

// DefaultRefillBatch is the refill batch of a SKU created without one: a
// quarter of an even share of the total, at least 1. Small batches keep
// stock where the demand is; large ones mean fewer moves.
func DefaultRefillBatch(total int64, segs int) int64 {
	return max(1, total/int64(4*max(segs, 1)))
}

func (cfg SKUConfig) validate() error {
	switch {
	case cfg.Total < 0 || cfg.Total > segments.MaxTotal:
		return &segments.InvalidError{Field: "total", Value: fmt.Sprint(cfg.Total), Reason: fmt.Sprintf("must be between 0 and %d", segments.MaxTotal)}
	case cfg.Segments < 1 || cfg.Segments > segments.MaxSegments:
		return &segments.InvalidError{Field: "segments", Value: fmt.Sprint(cfg.Segments), Reason: fmt.Sprintf("must be between 1 and %d", segments.MaxSegments)}
	case cfg.InitialFill < 0 || cfg.InitialFill > cfg.Total:
		return &segments.InvalidError{Field: "initial fill", Value: fmt.Sprint(cfg.InitialFill), Reason: fmt.Sprintf("must be between 0 and the total %d", cfg.Total)}
	case cfg.LowWatermark < 0 || cfg.LowWatermark > segments.MaxTotal:
		return &segments.InvalidError{Field: "low watermark", Value: fmt.Sprint(cfg.LowWatermark), Reason: fmt.Sprintf("must be between 0 and %d", segments.MaxTotal)}
	case cfg.RefillBatch < 0 || cfg.RefillBatch > segments.MaxTotal:
		return &segments.InvalidError{Field: "refill batch", Value: fmt.Sprint(cfg.RefillBatch), Reason: fmt.Sprintf("must be between 0 and %d", segments.MaxTotal)}
	case cfg.PerUserLimit < 0 || cfg.PerUserLimit > segments.MaxQty:
		return &segments.InvalidError{Field: "per-user limit", Value: fmt.Sprint(cfg.PerUserLimit), Reason: fmt.Sprintf("must be between 0 (none) and %d", segments.MaxQty)}
	}
	return nil
}

// CreateSKU creates sku with cfg and returns its meta record. Creating an
// existing SKU is ErrConflict.
//
// Creation takes several transactions when the segments do not fit in one
// (etcd's --max-txn-ops): all stock is first put in the pool, then moved to
// the segments in batches, so that total = pool + segments holds at every
// revision. Until the last step the SKU serves no requests (ErrUnknownSKU).
// If creation is interrupted, calling CreateSKU again with the same config
// completes it.
func (c *Coordinator) CreateSKU(ctx context.Context, sku string, cfg SKUConfig) (segments.Meta, error) {
	if err := segments.ValidateSKU(sku); err != nil {
		return segments.Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	if err := cfg.validate(); err != nil {
		return segments.Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	if cfg.RefillBatch == 0 {
		cfg.RefillBatch = DefaultRefillBatch(cfg.Total, cfg.Segments)
	}
	meta := segments.Meta{
		Total: cfg.Total, Segments: cfg.Segments, LowWatermark: cfg.LowWatermark,
		RefillBatch: cfg.RefillBatch, PerUserLimit: cfg.PerUserLimit, Creating: true, Created: time.Now().UTC().Truncate(time.Second),
	}
	metaKey := c.keys.Meta(sku)
	resp, err := c.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(metaKey), "=", 0)).
		Then(clientv3.OpPut(metaKey, segments.EncodeMeta(meta)),
			clientv3.OpPut(c.keys.Pool(sku), segments.EncodeCounter(cfg.Total))).
		Else(clientv3.OpGet(metaKey)).
		Commit()
	if err != nil {
		return segments.Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	metaRev := resp.Header.Revision
	if !resp.Succeeded {
		kv := resp.Responses[0].GetResponseRange().Kvs[0]
		old, err := segments.DecodeMeta(metaKey, kv.Value)
		if err != nil {
			return segments.Meta{}, fmt.Errorf("create %s: %w", sku, err)
		}
		if !old.Creating || old.Total != meta.Total || old.Segments != meta.Segments ||
			old.LowWatermark != meta.LowWatermark || old.RefillBatch != meta.RefillBatch || old.PerUserLimit != meta.PerUserLimit {
			return segments.Meta{}, fmt.Errorf("create %s: %w: the SKU already exists", sku, ErrConflict)
		}
		meta, metaRev = old, kv.ModRevision // resume an interrupted creation
	}
	if err := c.fillSegments(ctx, sku, cfg, metaKey, metaRev); err != nil {
		return segments.Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	meta.Creating = false
	done, err := c.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(metaKey), "=", metaRev)).
		Then(clientv3.OpPut(metaKey, segments.EncodeMeta(meta))).
		Commit()
	if err != nil {
		return segments.Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	if !done.Succeeded {
		return segments.Meta{}, fmt.Errorf("create %s: %w: another CreateSKU completed it concurrently", sku, ErrConflict)
	}
	return meta, nil
}

// fillSegments moves the initial fill from the pool into the segments, in
// transactions that fit --max-txn-ops, each one conditional on the meta
// record still being the one this creation wrote.
func (c *Coordinator) fillSegments(ctx context.Context, sku string, cfg SKUConfig, metaKey string, metaRev int64) error {
	n := int64(cfg.Segments)
	target := func(i int) int64 {
		t := cfg.InitialFill / n
		if int64(i) < cfg.InitialFill%n {
			t++
		}
		return t
	}
	info := &skuInfo{name: sku, segments: cfg.Segments}
	perTxn := c.opts.maxTxnOps - 2
	for {
		snap, err := c.snapshot(ctx, info, "")
		if err != nil {
			return err
		}
		poolResp, err := c.kv.Get(ctx, c.keys.Pool(sku))
		if err != nil {
			return err
		}
		poolMod := int64(0)
		if len(poolResp.Kvs) > 0 {
			poolMod = poolResp.Kvs[0].ModRevision
		}
		pool := snap.pool
		var ops []clientv3.Op
		for i := 0; i < cfg.Segments && len(ops) < perTxn; i++ {
			if add := target(i) - snap.segs[i]; add > 0 {
				ops = append(ops, clientv3.OpPut(c.keys.Segment(sku, i), segments.EncodeCounter(snap.segs[i]+add)))
				pool -= add
			}
		}
		if len(ops) == 0 {
			return nil
		}
		if pool < 0 {
			return fmt.Errorf("%w: pool of %s holds less than the initial fill", ErrCorrupt, sku)
		}
		ops = append(ops, clientv3.OpPut(c.keys.Pool(sku), segments.EncodeCounter(pool)))
		resp, err := c.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(metaKey), "=", metaRev),
				clientv3.Compare(clientv3.ModRevision(c.keys.Pool(sku)), "=", poolMod)).
			Then(ops...).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			// A concurrent resumption moved stock or finished: re-read.
			m, err := c.kv.Get(ctx, metaKey)
			if err != nil {
				return err
			}
			if len(m.Kvs) == 0 || m.Kvs[0].ModRevision != metaRev {
				return fmt.Errorf("%w: the SKU changed during creation", ErrConflict)
			}
		}
	}
}

// sku returns what never changes about a SKU, from the cache or etcd.
func (c *Coordinator) sku(ctx context.Context, name string) (*skuInfo, error) {
	c.stock.mu.Lock()
	info := c.stock.skus[name]
	c.stock.mu.Unlock()
	if info != nil {
		return info, nil
	}
	meta, _, err := c.Meta(ctx, name)
	if err != nil {
		return nil, err
	}
	info = &skuInfo{name: name, segments: meta.Segments, refillBatch: meta.RefillBatch, perUserLimit: meta.PerUserLimit}
	c.stock.mu.Lock()
	c.stock.skus[name] = info
	c.stock.mu.Unlock()
	return info, nil
}

// Meta reads sku's meta record and its mod revision. A SKU still being
// created is ErrUnknownSKU.
func (c *Coordinator) Meta(ctx context.Context, sku string) (segments.Meta, int64, error) {
	if err := segments.ValidateSKU(sku); err != nil {
		return segments.Meta{}, 0, err
	}
	key := c.keys.Meta(sku)
	resp, err := c.kv.Get(ctx, key)
	if err != nil {
		return segments.Meta{}, 0, fmt.Errorf("read meta of %s: %w", sku, err)
	}
	if len(resp.Kvs) == 0 {
		return segments.Meta{}, 0, fmt.Errorf("%w %q", ErrUnknownSKU, sku)
	}
	meta, err := segments.DecodeMeta(key, resp.Kvs[0].Value)
	if err != nil {
		return segments.Meta{}, 0, err
	}
	if meta.Creating {
		return segments.Meta{}, 0, fmt.Errorf("%w %q: its creation has not completed", ErrUnknownSKU, sku)
	}
	return meta, resp.Kvs[0].ModRevision, nil
}

// SKUs lists the SKUs whose creation has completed, in name order.
func (c *Coordinator) SKUs(ctx context.Context) ([]string, error) {
	resp, err := c.kv.Get(ctx, c.keys.MetaPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list SKUs: %w", err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		name, err := c.keys.ParseMeta(string(kv.Key))
		if err != nil {
			continue
		}
		if m, err := segments.DecodeMeta(string(kv.Key), kv.Value); err == nil && !m.Creating {
			out = append(out, name)
		}
	}
	return out, nil
}

// Restocked is the outcome of a restock.
type Restocked struct {
	SKU      string
	Total    int64 // the SKU's total after the restock
	Pool     int64 // the pool after the restock
	Revision int64
}

// Restock adds a new delivery of qty units to sku's pool and total (a
// returned order is Release, not Restock). It holds the pool's lock.
func (c *Coordinator) Restock(ctx context.Context, sku string, qty int64) (*Restocked, error) {
	if err := firstErr(segments.ValidateSKU(sku), segments.ValidateQty(qty)); err != nil {
		return nil, fmt.Errorf("restock %s: %w", sku, err)
	}
	info, err := c.sku(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("restock %s: %w", sku, err)
	}
	hp, err := c.lockPlace(ctx, info.name, segments.Pool, -1, nil)
	if err != nil {
		return nil, fmt.Errorf("restock %s: %w", sku, err)
	}
	defer hp.unlock()
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		meta, metaRev, err := c.Meta(ctx, sku)
		if err != nil {
			return nil, fmt.Errorf("restock %s: %w", sku, err)
		}
		if meta.Total+qty > segments.MaxTotal {
			return nil, fmt.Errorf("restock %s: %w", sku, &segments.InvalidError{Field: "qty", Value: fmt.Sprint(qty),
				Reason: fmt.Sprintf("would take the total %d past the maximum %d", meta.Total, segments.MaxTotal)})
		}
		if err := hp.load(ctx, false); err != nil {
			return nil, fmt.Errorf("restock %s: %w", sku, err)
		}
		hp.delta = qty
		meta.Total += qty
		resp, err := c.kv.Txn(ctx).
			If(append(hp.cmps(), clientv3.Compare(clientv3.ModRevision(c.keys.Meta(sku)), "=", metaRev))...).
			Then(append(hp.ops(), clientv3.OpPut(c.keys.Meta(sku), segments.EncodeMeta(meta)))...).
			Else(clientv3.OpGet(hp.h.own.key)).
			Commit()
		if err != nil {
			hp.invalidate()
			return nil, fmt.Errorf("restock %s: %w", sku, err)
		}
		if resp.Succeeded {
			pool := hp.newValue()
			hp.committed(resp.Header.Revision)
			return &Restocked{SKU: sku, Total: meta.Total, Pool: pool, Revision: resp.Header.Revision}, nil
		}
		if !stillOwned(resp.Responses[0], hp) {
			return nil, fmt.Errorf("restock %s: %w", sku, ErrLockLost)
		}
		hp.invalidate()
	}
	return nil, fmt.Errorf("restock %s: %w", sku, errContention)
}

// SetPolicy changes the rebalancer's low watermark and refill batch of sku
// (refillBatch 0 means the default). Running rebalancers pick it up on
// their next look at the SKU.
func (c *Coordinator) SetPolicy(ctx context.Context, sku string, lowWatermark, refillBatch int64) error {
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		meta, rev, err := c.Meta(ctx, sku)
		if err != nil {
			return fmt.Errorf("set policy of %s: %w", sku, err)
		}
		if refillBatch == 0 {
			refillBatch = DefaultRefillBatch(meta.Total, meta.Segments)
		}
		meta.LowWatermark, meta.RefillBatch = lowWatermark, refillBatch
		if err := meta.Validate(); err != nil {
			return fmt.Errorf("set policy of %s: %w", sku, err)
		}
		resp, err := c.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(c.keys.Meta(sku)), "=", rev)).
			Then(clientv3.OpPut(c.keys.Meta(sku), segments.EncodeMeta(meta))).
			Commit()
		if err != nil {
			return fmt.Errorf("set policy of %s: %w", sku, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("set policy of %s: %w", sku, errContention)
}
