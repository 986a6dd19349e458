package segments

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/seats"
)

// SKUConfig describes a SKU to create.
type SKUConfig struct {
	// Total is the stock put in at creation, 0 to MaxTotal.
	Total int64
	// Segments is the number of segments, 1 to MaxSegments. It
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
	case cfg.Total < 0 || cfg.Total > MaxTotal:
		return &InvalidError{Field: "total", Value: fmt.Sprint(cfg.Total), Reason: fmt.Sprintf("must be between 0 and %d", MaxTotal)}
	case cfg.Segments < 1 || cfg.Segments > MaxSegments:
		return &InvalidError{Field: "segments", Value: fmt.Sprint(cfg.Segments), Reason: fmt.Sprintf("must be between 1 and %d", MaxSegments)}
	case cfg.InitialFill < 0 || cfg.InitialFill > cfg.Total:
		return &InvalidError{Field: "initial fill", Value: fmt.Sprint(cfg.InitialFill), Reason: fmt.Sprintf("must be between 0 and the total %d", cfg.Total)}
	case cfg.LowWatermark < 0 || cfg.LowWatermark > MaxTotal:
		return &InvalidError{Field: "low watermark", Value: fmt.Sprint(cfg.LowWatermark), Reason: fmt.Sprintf("must be between 0 and %d", MaxTotal)}
	case cfg.RefillBatch < 0 || cfg.RefillBatch > MaxTotal:
		return &InvalidError{Field: "refill batch", Value: fmt.Sprint(cfg.RefillBatch), Reason: fmt.Sprintf("must be between 0 and %d", MaxTotal)}
	case cfg.PerUserLimit < 0 || cfg.PerUserLimit > MaxQty:
		return &InvalidError{Field: "per-user limit", Value: fmt.Sprint(cfg.PerUserLimit), Reason: fmt.Sprintf("must be between 0 (none) and %d", MaxQty)}
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
// completes it; with another config (the initial fill included) it is
// ErrConflict, naming the config of the creation in progress, and changes
// nothing. The result is the SKU as created, with its InitialFill.
//
// fence, if given, is compared in the transaction that writes the meta
// record: a failed fence is ErrConflict and writes nothing (a coordinator
// over several clusters fences a creation by the SKU's placement pin).
// Resuming an interrupted creation does not compare it: the meta record
// already holds the name in this cluster.
func (e *Engine) CreateSKU(ctx context.Context, sku string, cfg SKUConfig, fence ...clientv3.Cmp) (Meta, error) {
	if err := ValidateSKU(sku); err != nil {
		return Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	if err := cfg.validate(); err != nil {
		return Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	if cfg.RefillBatch == 0 {
		cfg.RefillBatch = DefaultRefillBatch(cfg.Total, cfg.Segments)
	}
	meta := Meta{
		Total: cfg.Total, Segments: cfg.Segments, LowWatermark: cfg.LowWatermark, RefillBatch: cfg.RefillBatch,
		PerUserLimit: cfg.PerUserLimit, InitialFill: cfg.InitialFill, Creating: true, Created: time.Now().UTC().Truncate(time.Second),
	}
	metaKey := e.keys.Meta(sku)
	resp, err := e.kv.Txn(ctx).
		If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(metaKey), "=", 0)}, fence...)...).
		Then(clientv3.OpPut(metaKey, EncodeMeta(meta)),
			clientv3.OpPut(e.keys.Pool(sku), EncodeCounter(cfg.Total))).
		Else(clientv3.OpGet(metaKey)).
		Commit()
	if err != nil {
		return Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	metaRev := resp.Header.Revision
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 { // only a fence fails with no meta record
			return Meta{}, fmt.Errorf("create %s: %w: its placement changed meanwhile (a concurrent delete or creation): retry", sku, ErrConflict)
		}
		kv := kvs[0]
		old, err := DecodeMeta(metaKey, kv.Value)
		if err != nil {
			return Meta{}, fmt.Errorf("create %s: %w", sku, err)
		}
		if !old.Creating {
			return Meta{}, fmt.Errorf("create %s: %w: the SKU already exists", sku, ErrConflict)
		}
		if old.Total != meta.Total || old.Segments != meta.Segments || old.InitialFill != meta.InitialFill ||
			old.LowWatermark != meta.LowWatermark || old.RefillBatch != meta.RefillBatch || old.PerUserLimit != meta.PerUserLimit {
			// Resuming it with this config would report values etcd does
			// not hold (the segments may already hold the other fill).
			return Meta{}, fmt.Errorf("create %s: %w: an interrupted creation is in progress with total %d, %d segments, "+
				"initial fill %d, low watermark %d, refill batch %d, per-user limit %d: create it again with those values to complete it",
				sku, ErrConflict, old.Total, old.Segments, old.InitialFill, old.LowWatermark, old.RefillBatch, old.PerUserLimit)
		}
		meta, metaRev = old, kv.ModRevision // resume an interrupted creation
	}
	e.ensureSpaceReserve(ctx)
	final := meta
	final.Creating = false
	completed, err := e.fillSegments(ctx, sku, cfg, metaKey, metaRev, final)
	if err != nil {
		return Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	meta.Creating = false
	if completed {
		return meta, nil
	}
	// Completed apart from the fill (or the fill was already written): the
	// record's revision does not date the counters (Meta.InitialFill).
	final.InitialFill = 0
	done, err := e.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(metaKey), "=", metaRev)).
		Then(clientv3.OpPut(metaKey, EncodeMeta(final))).
		Commit()
	if err != nil {
		return Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	if !done.Succeeded {
		return Meta{}, fmt.Errorf("create %s: %w: another CreateSKU completed it concurrently", sku, ErrConflict)
	}
	return meta, nil
}

// bornHomes returns, for each seat held by a process that sells lazily
// (internal/seats.Holders), its home segment of a new SKU of n segments
// (seats.Home) and the owner it names; where two seats share a home, the
// lower one's. fillSegments writes those segments' counters lazy and
// owned by them: the SKU is born with each selling process's home taken
// over, so that its first order there writes only its record (peekInto,
// adoptDirect). Nothing else about the counter changes: it holds
// its fill, and every reader counts it as it counts any lazy segment (no
// records yet). A seat is a hint: a home named to a process that has
// gone is taken over by the next that sells there, as an exact one would
// be claimed. A failed read names nobody.
func (e *Engine) bornHomes(ctx context.Context, sku string, n int) map[int]int64 {
	prefix := e.keys.SellersPrefix()
	resp, err := e.kv.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		e.log.Debug("create: read the sellers' seats", "sku", sku, "err", err)
		return nil
	}
	holders := seats.Holders(prefix, resp.Kvs)
	homes := make(map[int]int64, len(holders))
	for _, k := range slices.Sorted(maps.Keys(holders)) {
		if h := seats.Home(sku, k, n); homes[h] == 0 {
			homes[h] = holders[k]
		}
	}
	return homes
}

// fillSegments moves the initial fill from the pool into the segments, in
// transactions that fit --max-txn-ops, each one conditional on the meta
// record still being the one this creation wrote. The transaction that
// writes the rest of the fill also writes the completed meta record
// (final), and completed is true. When it wrote the whole fill (nothing
// of it was written before: an uninterrupted creation that fits one
// transaction) the record keeps its InitialFill, and its ModRevision is
// the revision of every segment's counter as born, which is how a seller
// knows its born home's fence without reading it (bornInto); otherwise
// it is written without it.
func (e *Engine) fillSegments(ctx context.Context, sku string, cfg SKUConfig, metaKey string, metaRev int64, final Meta) (completed bool, err error) {
	target := func(i int) int64 { return fillShare(cfg.InitialFill, cfg.Segments, i) }
	info := &skuInfo{name: sku, segments: cfg.Segments}
	perTxn := e.cfg.MaxTxnOps - 2
	homes := e.bornHomes(ctx, sku, cfg.Segments)
	for {
		snap, err := e.snapshot(ctx, info, "")
		if err != nil {
			return false, err
		}
		// The pool's revision as of the snapshot: the fill below is worked
		// out from the snapshot, so the transaction must fail if anyone
		// wrote the pool after it. Read apart and later, a concurrent
		// resumption's fill between the two reads passed the compare, and
		// this one wrote the pool from the snapshot's stale value
		// (TestConcurrentResumesOfACreation, beside four busy loops: 124
		// units made).
		poolResp, err := e.kv.Get(ctx, e.keys.Pool(sku), clientv3.WithRev(snap.rev))
		if err != nil {
			return false, err
		}
		poolMod := int64(0)
		if len(poolResp.Kvs) > 0 {
			poolMod = poolResp.Kvs[0].ModRevision
		}
		pool := snap.pool
		var ops []clientv3.Op
		whole := !slices.ContainsFunc(snap.segs, func(n int64) bool { return n != 0 }) // no part of the fill written yet
		i := 0
		for ; i < cfg.Segments && len(ops) < perTxn; i++ {
			if add := target(i) - snap.segs[i]; add > 0 {
				c := SegmentCounter{N: snap.segs[i] + add}
				if snap.segs[i] == 0 {
					c.Owner = homes[i] // 0 where no seat's home is
				}
				ops = append(ops, clientv3.OpPut(e.keys.Segment(sku, i), EncodeSegmentCounter(c)))
				pool -= add
			}
		}
		if len(ops) == 0 {
			return false, nil
		}
		if pool < 0 {
			return false, fmt.Errorf("%w: pool of %s holds less than the initial fill", ErrCorrupt, sku)
		}
		ops = append(ops, clientv3.OpPut(e.keys.Pool(sku), EncodeCounter(pool)))
		// The rest of the fill is in this transaction (every segment was
		// seen, and it holds at most perTxn of them): it completes the
		// creation too, in the room left for it.
		last := i == cfg.Segments
		if last {
			if !whole {
				final.InitialFill = 0 // the counters are of several revisions
			}
			ops = append(ops, clientv3.OpPut(metaKey, EncodeMeta(final)))
		}
		resp, err := e.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(metaKey), "=", metaRev),
				clientv3.Compare(clientv3.ModRevision(e.keys.Pool(sku)), "=", poolMod)).
			Then(ops...).Commit()
		if err != nil {
			return false, err
		}
		if resp.Succeeded && last {
			return true, nil
		}
		if !resp.Succeeded {
			// A concurrent resumption moved stock or finished: re-read.
			m, err := e.kv.Get(ctx, metaKey)
			if err != nil {
				return false, err
			}
			if len(m.Kvs) == 0 || m.Kvs[0].ModRevision != metaRev {
				return false, fmt.Errorf("%w: the SKU changed during creation (another CreateSKU completed it concurrently, or it was deleted)", ErrConflict)
			}
		}
	}
}

// fillShare is segment i's share of an initial fill over n segments: the
// fill spread evenly, the first segments taking one more of what is left.
func fillShare(fill int64, n, i int) int64 {
	t := fill / int64(n)
	if int64(i) < fill%int64(n) {
		t++
	}
	return t
}
