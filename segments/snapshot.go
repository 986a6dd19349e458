package segments

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
)

// snapshot is every counter of one SKU at one revision. It is read-only
// once made: a look shares one among the orders it answers.
type snapshot struct {
	rev int64
	// verified is the SKU's incarnation (its meta record's
	// CreateRevision) that the read checked at rev, 0 if it did not: a
	// look reads the meta record in its transaction (look.go).
	verified int64
	pool     int64
	segs     []int64 // counter + inbox of each segment
	// inbox and inMod are each segment's inbox and its ModRevision (0:
	// absent), for the caches of the segments this process holds.
	inbox, inMod []int64
	// cnt and cntMod are each segment's counter and its ModRevision, for
	// direct orders (sell.go's tryDirect).
	cnt, cntMod []int64
	// ctr is each segment's counter as stored (cnt is what it holds: a
	// lazy counter's N less its unsettled sales), and lazy the segments
	// whose unsettled sales are still to be subtracted (settleLazy).
	ctr     []SegmentCounter
	lazy    []lazySeg
	orderKV *mvccpb.KeyValue
}

// settleLazy subtracts the lazy segments' unsettled sales, as read at the
// snapshot's revision.
func (s *snapshot) settleLazy(sold map[int]int64) {
	for i, q := range sold {
		s.segs[i] -= q
		s.cnt[i] -= q
	}
	s.lazy = nil
}

func (s *snapshot) total() int64 {
	t := s.pool
	for _, v := range s.segs {
		t += v
	}
	return t
}

// candidates are the places that alone hold at least qty: the pool first,
// then the segments after home in ring order, home last.
func (s *snapshot) candidates(qty int64, home int) []Place {
	var ps []Place
	if s.pool >= qty {
		ps = append(ps, Pool)
	}
	n := len(s.segs)
	for i := 1; i <= n; i++ {
		if j := (home + i) % n; s.segs[j] >= qty {
			ps = append(ps, Segment(j))
		}
	}
	return ps
}

// withStock are the places holding anything, in the global lock order.
func (s *snapshot) withStock() []Place {
	var ps []Place
	if s.pool > 0 {
		ps = append(ps, Pool)
	}
	for i, v := range s.segs {
		if v > 0 {
			ps = append(ps, Segment(i))
		}
	}
	return ps
}

// snapshot reads all of sku's counters, and the record of order (if order is
// not empty), in one transaction: one revision.
func (e *Engine) snapshot(ctx context.Context, sku *skuInfo, order string) (*snapshot, error) {
	ops := []clientv3.Op{clientv3.OpGet(e.keys.SKUStock(sku.name), clientv3.WithPrefix())}
	if order != "" {
		ops = append(ops, clientv3.OpGet(e.keys.Order(sku.name, order)))
	}
	resp, err := e.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read stock: %w", err)
	}
	s, err := e.decodeSnapshot(sku, resp.Header.Revision, resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return nil, err
	}
	if len(s.lazy) > 0 {
		sold, err := e.unsettled(ctx, sku.name, s.rev, s.lazy)
		if err != nil {
			return nil, err
		}
		s.settleLazy(sold)
	}
	if order != "" {
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			s.orderKV = kvs[0]
		}
	}
	return s, nil
}

// decodeSnapshot makes a snapshot of sku at rev from the key-values under
// its SKUStock prefix.
func (e *Engine) decodeSnapshot(sku *skuInfo, rev int64, kvs []*mvccpb.KeyValue) (*snapshot, error) {
	n := sku.segments
	s := &snapshot{rev: rev, segs: make([]int64, n), inbox: make([]int64, n), inMod: make([]int64, n),
		cnt: make([]int64, n), cntMod: make([]int64, n), ctr: make([]SegmentCounter, n)}
	for _, kv := range kvs {
		k, c, err := e.decodeStockKV(sku, kv)
		if err != nil {
			return nil, err
		}
		v := c.N
		switch k.Kind {
		case keys.KindPool:
			s.pool = v
		case keys.KindInbox:
			s.segs[k.Index] += v
			s.inbox[k.Index], s.inMod[k.Index] = v, kv.ModRevision
		default:
			s.segs[k.Index] += v
			s.cnt[k.Index], s.cntMod[k.Index], s.ctr[k.Index] = v, kv.ModRevision, c
			if l, ok := lazyOf(k.Index, c, kv.ModRevision); ok {
				s.lazy = append(s.lazy, l)
			}
		}
	}
	return s, nil
}

// decodeStockKV parses a key under SKUStock and its counter value (a
// segment's may be lazy; the pool's and inboxes' are always exact). A key
// that is not a counter of this SKU, or a segment beyond its count, is
// reported as corrupt: something other than stockctl wrote there.
func (e *Engine) decodeStockKV(sku *skuInfo, kv *mvccpb.KeyValue) (keys.StockKey, SegmentCounter, error) {
	key := string(kv.Key)
	k, err := e.keys.ParseStock(key)
	if err == nil && k.SKU == sku.name && k.Index < sku.segments {
		if k.Kind == keys.KindSegment {
			c, err := DecodeSegmentCounter(key, kv.Value)
			return k, c, err
		}
		v, err := decodeExact(key, kv.Value)
		return k, SegmentCounter{N: v}, err
	}
	if err == nil {
		err = fmt.Errorf("segment %d of a SKU with %d segments", k.Index, sku.segments)
	}
	return k, SegmentCounter{}, &CorruptError{Key: key, Value: kv.Value, Err: err}
}
