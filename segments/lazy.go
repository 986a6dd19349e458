package segments

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
)

// Lazy segments (SegmentCounter): a segment that one process sells from
// without its lock is not rewritten by its orders; its units are its
// counter's N minus the parts of the order records created after its base.
// Everything that counts a segment's units (a look, Status, Audit, a lock
// holder taking it, another process taking it over) reads those records
// at the revision it read the counters, and subtracts them here.

// lazySeg is a segment whose counter is lazy, as read: its index and the
// revision its unsettled sales are counted from.
type lazySeg struct {
	index int
	base  int64
	n     int64 // the counter's N
}

// lazyOf returns the segment as a lazySeg if its counter may have unsettled
// sales. A lazy counter whose N is 0 has none: its owner sells only what N
// holds (taking the inbox rewrites the counter).
func lazyOf(index int, c SegmentCounter, modRev int64) (lazySeg, bool) {
	if !c.Lazy() || c.N == 0 {
		return lazySeg{}, false
	}
	return lazySeg{index: index, base: c.BaseAt(modRev), n: c.N}, true
}

// unsettledRead is the read of sku's records that lazy needs, at rev (0:
// the transaction's own revision). It reads only the records created
// after the oldest base.
func (e *Engine) unsettledRead(sku string, rev int64, lazy []lazySeg) clientv3.Op {
	minBase := lazy[0].base
	for _, l := range lazy[1:] {
		minBase = min(minBase, l.base)
	}
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithMinCreateRev(minBase + 1)}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	return clientv3.OpGet(e.keys.Orders(sku), opts...)
}

// unsettledSales sums, per lazy segment, the parts taken from it by the
// records in kvs created after its base.
func unsettledSales(sku string, lazy []lazySeg, kvs []*mvccpb.KeyValue) (map[int]int64, error) {
	base := make(map[int]int64, len(lazy))
	for _, l := range lazy {
		base[l.index] = l.base
	}
	sold := make(map[int]int64, len(lazy))
	for _, kv := range kvs {
		o, err := DecodeOrder(string(kv.Key), kv.Value)
		if err != nil {
			return nil, err
		}
		if o.SKU != sku {
			return nil, &CorruptError{Key: string(kv.Key), Value: kv.Value, Err: fmt.Errorf("record names SKU %q", o.SKU)}
		}
		for _, p := range o.Parts {
			if p.Place.IsPool() {
				continue
			}
			if b, ok := base[p.Place.Index()]; ok && kv.CreateRevision > b {
				sold[p.Place.Index()] += p.Qty
			}
		}
	}
	return sold, nil
}

// unsettled reads and sums sku's unsettled lazy sales at rev (see
// unsettledSales).
func (e *Engine) unsettled(ctx context.Context, sku string, rev int64, lazy []lazySeg) (map[int]int64, error) {
	if len(lazy) == 0 {
		return nil, nil
	}
	resp, err := e.kv.Txn(ctx).Then(e.unsettledRead(sku, rev, lazy)).Commit()
	if err != nil {
		return nil, fmt.Errorf("read the unsettled orders of %s: %w", sku, err)
	}
	return unsettledSales(sku, lazy, resp.Responses[0].GetResponseRange().Kvs)
}

// settleSKU writes every lazy segment of sku with its exact units, so that
// no order record is needed to count them (DeleteSKU archives every record
// first). Per segment it is two transactions: a mark that ends the owner's
// lazy sales (it rewrites the counter, which the owner's commits compare)
// and reads the records since the base, then the exact counter, on
// condition that nothing wrote it in between.
func (e *Engine) settleSKU(ctx context.Context, sku string) error {
	info, err := e.sku(ctx, sku)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		if attempt >= maxCommitAttempts {
			return fmt.Errorf("settle %s: its counters kept moving: %w", sku, ErrContention)
		}
		resp, err := e.kv.Get(ctx, e.keys.SKUStock(sku), clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("settle %s: %w", sku, err)
		}
		moved := false
		for _, kv := range resp.Kvs {
			k, c, err := e.decodeStockKV(info, kv)
			if err != nil {
				return fmt.Errorf("settle %s: %w", sku, err)
			}
			if k.Kind != keys.KindSegment || !c.Lazy() {
				continue
			}
			settled, err := e.settleSegment(ctx, sku, string(kv.Key), kv.Value, kv.ModRevision, c, k.Index)
			if err != nil {
				return fmt.Errorf("settle %s: %w", sku, err)
			}
			moved = moved || !settled
		}
		if !moved {
			return nil
		}
	}
}

// settleSegment writes one lazy segment's exact units (see settleSKU):
// the mark, which ends its owner's lazy sales and reads the records since
// its base, then the exact counter. The counter as read is raw at mod.
// It reports false, having written nothing lasting, if the counter moved
// before either write.
func (e *Engine) settleSegment(ctx context.Context, sku, key string, raw []byte, mod int64, c SegmentCounter, index int) (bool, error) {
	l := lazySeg{index: index, base: c.BaseAt(mod), n: c.N}
	mark, err := e.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).
		Then(clientv3.OpPut(key, EncodeSegmentCounter(SegmentCounter{N: c.N, Base: l.base})), e.unsettledRead(sku, 0, []lazySeg{l})).
		Commit()
	if err != nil {
		return false, err
	}
	if !mark.Succeeded {
		return false, nil
	}
	sold, err := unsettledSales(sku, []lazySeg{l}, mark.Responses[1].GetResponseRange().GetKvs())
	if err != nil {
		return false, err
	}
	units := c.N - sold[l.index]
	if units < 0 {
		return false, &CorruptError{Key: key, Value: raw,
			Err: fmt.Errorf("orders since revision %d took %d units from a segment that held %d", l.base, sold[l.index], c.N)}
	}
	put, err := e.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mark.Header.Revision)).
		Then(clientv3.OpPut(key, EncodeCounter(units))).Commit()
	if err != nil {
		return false, err
	}
	return put.Succeeded, nil
}

// staleLazyRecords bounds how far a lazy segment's unsettled sales may
// reach back, counted in the SKU's records created since its base. Every
// reader of a lazy segment reads all the SKU's records since the oldest
// base, whichever segment they sold from; an owner settles its segment
// every settleEvery sales, but a segment it left with fewer unsettled
// sales (it moved to another segment, or stopped) would keep the oldest
// base where it was, and every look would read the whole sale since. A
// look that counts more records than this since a segment's base settles
// that segment in the background (settleStale). An owner still selling
// there loses its lazy tenure and takes the segment again: one write. The
// bound is above what active segments reach (settleEvery sales each,
// with the SKU's other segments selling meanwhile).
var staleLazyRecords = 4096 // a variable for the tests

// staleLazy returns the segments of lazy whose base more than
// staleLazyRecords of kvs (the SKU's records since the oldest base) were
// created after.
func staleLazy(lazy []lazySeg, kvs []*mvccpb.KeyValue) []lazySeg {
	var stale []lazySeg
	for _, l := range lazy {
		n := 0
		for _, kv := range kvs {
			if kv.CreateRevision > l.base {
				n++
			}
		}
		if n > staleLazyRecords {
			stale = append(stale, l)
		}
	}
	return stale
}

// settleStale settles sku's stale lazy segments (staleLazy) in the
// background, one settle of a SKU at a time; a settle already running for
// sku makes this a no-op. It reads each counter again: one that moved
// since the look (its owner settled it, or someone took it over) is left
// as it is.
func (e *Engine) settleStale(info *skuInfo, stale []lazySeg) {
	if len(stale) == 0 {
		return
	}
	if _, running := e.settling.LoadOrStore(info.name, true); running {
		return
	}
	e.bg.Go(func(ctx context.Context) {
		defer e.settling.Delete(info.name)
		for _, l := range stale {
			key := e.counterKey(info.name, Segment(l.index))
			resp, err := e.kv.Get(ctx, key)
			if err != nil || len(resp.Kvs) != 1 {
				return
			}
			kv := resp.Kvs[0]
			_, c, err := e.decodeStockKV(info, kv)
			if err != nil || !c.Lazy() || c.BaseAt(kv.ModRevision) != l.base {
				continue
			}
			if _, err := e.settleSegment(ctx, info.name, key, kv.Value, kv.ModRevision, c, l.index); err != nil {
				e.log.Debug("settle a stale lazy segment", "sku", info.name, "segment", l.index, "err", err)
			}
		}
	})
}

// settleOwnedChunk is how many owned segments SettleOwned writes in one
// transaction.
const settleOwnedChunk = 32

// SettleOwned writes, for every segment this process sells lazily (its
// counter names this process), the exact units it holds, and no owner. The
// owner knows them without the records: its direct cache follows its own
// commits. A closing coordinator calls it, once its commits have ended, so
// that whoever reads counters (the rebalancer above all: it does not read
// records) sees what the segments hold rather than their N, which only
// bounds it, and no reader needs the records since their bases. A counter
// that moved since this process's last commit there (another process took
// the segment over, a lock holder marked it) is left as it is. It returns
// how many segments it wrote; ctx bounds it.
func (e *Engine) SettleOwned(ctx context.Context) (int, error) {
	type owned struct {
		st    *placeState
		value int64
		mod   int64
		born  string // a born home's value, unread (bornDirect): compared too
	}
	var todo []owned
	e.mu.Lock()
	for _, st := range e.places {
		st.mu.Lock()
		d := st.direct
		st.mu.Unlock()
		if d.known && d.owned && d.owner == e.owner && d.pending == 0 {
			o := owned{st: st, value: d.value, mod: d.mod}
			if d.born {
				o.born = EncodeSegmentCounter(d.raw)
			}
			todo = append(todo, o)
		}
	}
	e.mu.Unlock()
	written := 0
	put := func(chunk []owned) (bool, error) {
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, o := range chunk {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(o.st.key), "=", o.mod))
			if o.born != "" {
				cmps = append(cmps, clientv3.Compare(clientv3.Value(o.st.key), "=", o.born))
			}
			ops = append(ops, clientv3.OpPut(o.st.key, EncodeSegmentCounter(SegmentCounter{N: o.value})))
		}
		resp, err := e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return false, fmt.Errorf("settle the segments this process sells lazily: %w", err)
		}
		if resp.Succeeded {
			written += len(chunk)
			for _, o := range chunk {
				o.st.forgetDirect()
			}
		}
		return resp.Succeeded, nil
	}
	for len(todo) > 0 {
		chunk := todo[:min(settleOwnedChunk, len(todo))]
		todo = todo[len(chunk):]
		ok, err := put(chunk)
		if err != nil {
			return written, err
		}
		if ok || len(chunk) == 1 {
			continue
		}
		// A counter of the chunk moved: each on its own.
		for i := range chunk {
			if _, err := put(chunk[i : i+1]); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}
