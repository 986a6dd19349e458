package segments

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
)

// Archive is a SKU's record of its pruned orders (keys.Archive). Prune
// writes it in the transaction that deletes the records it counts, so the
// books balance at every revision:
//
//	total = pool + Σ segments + Σ active orders + Archive.Units
type Archive struct {
	V int `json:"v"`
	// Orders counts the order records pruned; Released and Expired those
	// of them that no longer held stock.
	Orders   int64 `json:"orders"`
	Released int64 `json:"released"`
	Expired  int64 `json:"expired"`
	// Units is what the pruned active orders (plain allocations and
	// confirmed reservations) held: sold stock, still part of the total.
	Units int64 `json:"units"`
	// Through is the creation time of the newest order pruned.
	Through time.Time `json:"through"`
	// Claims counts the pruned orders whose IDs are still kept
	// (KeepPrunedIDs): the records under orders/ that are claims, not
	// orders. Status counts the orders as the records less these.
	Claims int64 `json:"claims,omitempty"`
}

// EncodeArchive encodes a with the current version.
func EncodeArchive(a Archive) string {
	a.V = Version
	return mustJSON(a)
}

// DecodeArchive strictly decodes the archive record stored at key.
func DecodeArchive(key string, value []byte) (Archive, error) {
	var a Archive
	if err := strictJSON(value, &a); err != nil {
		return Archive{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	if err := checkVersion(a.V); err != nil {
		return Archive{}, &CorruptError{Key: key, Value: value, Err: err}
	}
	if a.Orders < 0 || a.Units < 0 || a.Units > MaxTotal || a.Released < 0 || a.Expired < 0 || a.Released+a.Expired > a.Orders || a.Claims < 0 || a.Claims > a.Orders {
		return Archive{}, &CorruptError{Key: key, Value: value, Err: fmt.Errorf("counts out of range")}
	}
	return a, nil
}

// decodeArchiveKVs decodes an optional archive record (none: the zero Archive).
func decodeArchiveKVs(kvs []*mvccpb.KeyValue) (Archive, error) {
	if len(kvs) == 0 {
		return Archive{}, nil
	}
	return DecodeArchive(string(kvs[0].Key), kvs[0].Value)
}

// Pruned is the outcome of Prune.
type Pruned struct {
	SKU string
	// Orders, Released, Expired and Units are what this call archived (see
	// Archive); Buyers counts the buyers' counters it lowered.
	Orders, Released, Expired, Units int64
	Buyers                           int64
	// Forgotten counts the claims of orders pruned earlier whose retention
	// ended in this call: retries of those order IDs are new orders now.
	Forgotten int64
	// Archive is the SKU's archive record after the call.
	Archive Archive
	// Revision is the revision of the last transaction (0 if nothing was
	// pruned).
	Revision int64
}

// DefaultPrunedIDRetention is how long Prune keeps a pruned order's ID
// unless told otherwise (KeepPrunedIDs): a retry of the order within it is
// refused with ErrOrderPruned.
const DefaultPrunedIDRetention = 24 * time.Hour

// PruneOption changes how Prune archives.
type PruneOption func(*pruneConfig)

type pruneConfig struct{ keepIDs time.Duration }

// KeepPrunedIDs sets how long Prune keeps the ID of each order it archives
// (DefaultPrunedIDRetention if not given), counted from the prune: the
// order's record is replaced by a small claim (StatePruned, no quantity,
// no parts) so that a retry of the order, or a Release, Cancel or Confirm
// of it, gets ErrOrderPruned instead of being applied as a new order. A
// later Prune deletes the claims whose retention ended (Pruned.Forgotten);
// from then on the ID is free again. 0 deletes the records at once, and
// every claim still kept, as stockctl before 0.x did: a retry of a pruned
// order is then a new order. Negative values are refused.
func KeepPrunedIDs(d time.Duration) PruneOption { return func(c *pruneConfig) { c.keepIDs = d } }

// prunePage is how many order records Prune reads at once.
const prunePage = 1000

// Prune archives sku's orders created before before (by the clock of the
// process that committed each): it adds them to the SKU's archive record
// and replaces each record by a small claim of its order ID, kept for a
// retention (KeepPrunedIDs, 24 h by default), in transactions that each
// keep the books balanced. Live reservations are never pruned (they still
// wait for a Confirm or their expiry), nor, over several clusters, the
// record that carries a committed order's decision while a line of the
// order in another cluster still waits for it (across.go); the decision
// goes with that record. Claims whose retention ended are deleted on the
// way.
//
// What it costs the orders pruned: they can no longer be released,
// cancelled or confirmed, and a retry of one is refused (both
// ErrOrderPruned) while its claim is kept, and is a new order after (so
// keep the IDs longer than any client retries); and the units of an
// active order counted against its buyer's per-user limit are taken off
// the buyer's counter (a limit then holds over the orders kept, not over
// the archived ones).
//
// ctx bounds the call; on failure the transactions already committed stay
// (each pruned a whole batch), and calling Prune again goes on.
func (e *Engine) Prune(ctx context.Context, sku string, before time.Time, opts ...PruneOption) (*Pruned, error) {
	cfg := pruneConfig{keepIDs: DefaultPrunedIDRetention}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.keepIDs < 0 {
		return nil, fmt.Errorf("prune %s: %w", sku,
			invalid("retention of pruned order IDs", cfg.keepIDs, "must be 0 (forget them at once) or more"))
	}
	if err := ValidateSKU(sku); err != nil {
		return nil, fmt.Errorf("prune %s: %w", sku, err)
	}
	if _, _, err := e.Meta(ctx, sku); err != nil {
		return nil, fmt.Errorf("prune %s: %w", sku, err)
	}
	out, err := e.prune(ctx, sku, before, cfg.keepIDs)
	if err != nil {
		return out, fmt.Errorf("prune %s: %w", sku, err)
	}
	return out, nil
}

// prune is Prune without the checks and with errors unwrapped. keepIDs is
// the retention of the claims it leaves (0: none).
func (e *Engine) prune(ctx context.Context, sku string, before time.Time, keepIDs time.Duration) (*Pruned, error) {
	out := &Pruned{SKU: sku}
	// Segments sold lazily count their orders from the records: write
	// them exact first (their owners take them again at their next
	// order), so that the records are no longer needed. If that fails (a
	// full etcd refuses the puts, deletes still pass), the records they
	// still count are kept, the others pruned, and the error returned
	// after: running prune again goes on.
	settleErr := e.settleSKU(ctx, sku)
	if settleErr != nil && ctx.Err() != nil {
		return out, settleErr
	}
	keepAfter, err := e.prunable(ctx, sku)
	if err != nil {
		return out, err
	}
	// Claims pruned before forgetAt have served their retention.
	forgetAt := time.Now().Add(-keepIDs)
	from, end := e.keys.Orders(sku), clientv3.GetPrefixRangeEnd(e.keys.Orders(sku))
	for attempts := 0; ; {
		resp, err := e.kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(prunePage))
		if err != nil {
			return out, err
		}
		var batch []*mvccpb.KeyValue
		var orders []Order
		flushed := true
		for i, kv := range resp.Kvs {
			o, err := DecodeOrder(string(kv.Key), kv.Value)
			if err != nil {
				return out, err
			}
			switch {
			case o.IsPruned():
				if keepIDs == 0 || o.PrunedAt.Before(forgetAt) {
					batch, orders = append(batch, kv), append(orders, o)
				}
			case !o.Reserved() && o.Created.Before(before) && kv.CreateRevision <= keepAfter && e.prunableAcross(ctx, o):
				// (An order over several clusters keeps, at its first SKU,
				// its commit decision until no line elsewhere waits for
				// it: across.go.)
				batch, orders = append(batch, kv), append(orders, o)
			}
			last := i == len(resp.Kvs)-1
			if len(batch) < e.pruneBatchSize() && !(last && len(batch) > 0) {
				continue
			}
			done, err := e.pruneTxn(ctx, sku, batch, orders, keepIDs > 0, out)
			if err != nil {
				return out, err
			}
			if !done {
				// A record or a counter moved under the batch: read from
				// its first key again.
				if attempts++; attempts >= maxCommitAttempts {
					return out, errContention
				}
				from, flushed = string(batch[0].Key), false
				break
			}
			batch, orders = nil, nil
		}
		if !flushed {
			continue
		}
		if !resp.More {
			if settleErr != nil {
				return out, fmt.Errorf("orders still counted by segments sold lazily were kept: %w", settleErr)
			}
			if out.Revision == 0 {
				a, err := e.kv.Get(ctx, e.keys.Archive(sku))
				if err != nil {
					return out, err
				}
				if out.Archive, err = decodeArchiveKVs(a.Kvs); err != nil {
					return out, err
				}
			}
			return out, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// pruneBatchSize is how many orders one prune transaction archives: two
// writes each (the record's claim or delete, the legacy claim's delete),
// at worst a buyer's counter each, and the commit decision of an order
// over several clusters, within --max-txn-ops.
func (e *Engine) pruneBatchSize() int { return max(1, (e.cfg.MaxTxnOps-1)/4) }

// pruneTxn archives one batch in one transaction that compares every
// record's revision, the archive's and the buyers' counters'. Each order's
// record becomes its ID's claim if keepIDs (deleted if not); a claim in
// the batch (its retention ended) is deleted. It reports false, changing
// nothing, when one of them moved since it was read.
func (e *Engine) pruneTxn(ctx context.Context, sku string, kvs []*mvccpb.KeyValue, orders []Order, keepIDs bool, out *Pruned) (bool, error) {
	take := map[string]int64{} // buyer counter → units of active counted orders
	var users []string
	for _, o := range orders {
		if o.Active() && o.UserCounted {
			k := e.keys.User(sku, o.Buyer)
			if _, ok := take[k]; !ok {
				users = append(users, k)
			}
			take[k] += o.Qty
		}
	}
	reads := []clientv3.Op{clientv3.OpGet(e.keys.Archive(sku))}
	for _, k := range users {
		reads = append(reads, clientv3.OpGet(k))
	}
	// The records again, in the same read as the buyers' counters: a
	// release or a cancel between the page's read and this one lowers a
	// counter below what the page's records say, and is a race, not
	// corruption.
	for _, kv := range kvs {
		reads = append(reads, clientv3.OpGet(string(kv.Key), clientv3.WithKeysOnly()))
	}
	cur, err := e.kv.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		return false, err
	}
	arcKVs := cur.Responses[0].GetResponseRange().Kvs
	arc, err := decodeArchiveKVs(arcKVs)
	if err != nil {
		return false, err
	}
	var arcMod int64
	if len(arcKVs) > 0 {
		arcMod = arcKVs[0].ModRevision
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(e.keys.Archive(sku)), "=", arcMod)}
	var ops []clientv3.Op
	add := Archive{}
	var forgotten int64
	now := time.Now()
	for i, o := range orders {
		key := string(kvs[i].Key)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", kvs[i].ModRevision))
		if o.IsPruned() {
			ops = append(ops, clientv3.OpDelete(key))
			forgotten++
			continue
		}
		// The record is the ID's claim: kept as a pruned claim for the
		// retention, or deleted. The orderid/ key is a legacy claim,
		// present only on orders placed by an older stockctl (its
		// delete costs nothing when absent).
		if keepIDs {
			ops = append(ops, clientv3.OpPut(key, EncodeOrder(prunedClaim(o, now))))
			add.Claims++
		} else {
			ops = append(ops, clientv3.OpDelete(key))
		}
		ops = append(ops, clientv3.OpDelete(e.keys.OrderID(o.ID)))
		if decidesHere(o) {
			ops = append(ops, clientv3.OpDelete(e.keys.Decision(sku, o.ID)))
		}
		add.Orders++
		switch {
		case o.State == StateExpired:
			add.Expired++
		case o.Released:
			add.Released++
		default:
			add.Units += o.Qty
		}
		if o.Created.After(add.Through) {
			add.Through = o.Created
		}
	}
	for i, k := range users {
		v, mod, err := decodeCounterKV(k, cur.Responses[1+i].GetResponseRange())
		if err != nil {
			return false, err
		}
		if v < take[k] {
			for j, kv := range kvs {
				now := cur.Responses[1+len(users)+j].GetResponseRange().GetKvs()
				if len(now) == 0 || now[0].ModRevision != kv.ModRevision {
					return false, nil // a record moved since the page was read: read again
				}
			}
			return false, fmt.Errorf("%w: buyer counter %s holds %d, less than its pruned orders' %d (read at revision %d)",
				ErrCorrupt, k, v, take[k], cur.Header.Revision)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", mod))
		if v == take[k] {
			ops = append(ops, clientv3.OpDelete(k))
		} else {
			ops = append(ops, clientv3.OpPut(k, EncodeCounter(v-take[k])))
		}
	}
	arc.Orders += add.Orders
	arc.Released += add.Released
	arc.Expired += add.Expired
	arc.Units += add.Units
	arc.Claims += add.Claims - forgotten
	if arc.Claims < 0 {
		return false, fmt.Errorf("%w: the archive record counts %d kept claims of pruned orders, fewer than the %d this prune forgets (read at revision %d)",
			ErrCorrupt, arc.Claims+forgotten-add.Claims, forgotten, cur.Header.Revision)
	}
	if add.Through.After(arc.Through) {
		arc.Through = add.Through
	}
	if add.Orders > 0 || forgotten > 0 {
		ops = append(ops, clientv3.OpPut(e.keys.Archive(sku), EncodeArchive(arc)))
	}
	resp, err := e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, err
	}
	if !resp.Succeeded {
		return false, nil
	}
	out.Orders += add.Orders
	out.Released += add.Released
	out.Expired += add.Expired
	out.Units += add.Units
	out.Buyers += int64(len(users))
	out.Forgotten += forgotten
	out.Archive, out.Revision = arc, resp.Header.Revision
	return true, nil
}

// prunable is the newest creation revision of a record prune may delete:
// the revision it reads the SKU's counters at, or the oldest base of a lazy
// segment if older. A lazy segment's units are its N less the records
// created after its base (SegmentCounter): those records must stay. Bases
// only move forward, and a segment that is exact now counts no record
// created before its counter's current revision, so what is prunable now
// stays prunable.
func (e *Engine) prunable(ctx context.Context, sku string) (int64, error) {
	info, err := e.sku(ctx, sku)
	if err != nil {
		return 0, err
	}
	resp, err := e.kv.Get(ctx, e.keys.SKUStock(sku), clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	limit := resp.Header.Revision
	for _, kv := range resp.Kvs {
		k, c, err := e.decodeStockKV(info, kv)
		if err != nil {
			return 0, err
		}
		if l, ok := lazyOf(k.Index, c, kv.ModRevision); ok && k.Kind == keys.KindSegment {
			limit = min(limit, l.base)
		}
	}
	return limit, nil
}
