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
	rev  int64
	pool int64
	segs []int64 // counter + inbox of each segment
	// inbox and inMod are each segment's inbox and its ModRevision (0:
	// absent), for the caches of the segments this process holds.
	inbox, inMod []int64
	// cnt and cntMod are each segment's counter and its ModRevision, for
	// direct orders (direct.go).
	cnt, cntMod []int64
	orderKV     *mvccpb.KeyValue
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
		cnt: make([]int64, n), cntMod: make([]int64, n)}
	for _, kv := range kvs {
		k, v, err := e.decodeStockKV(sku, kv)
		if err != nil {
			return nil, err
		}
		switch k.Kind {
		case keys.KindPool:
			s.pool = v
		case keys.KindInbox:
			s.segs[k.Index] += v
			s.inbox[k.Index], s.inMod[k.Index] = v, kv.ModRevision
		default:
			s.segs[k.Index] += v
			s.cnt[k.Index], s.cntMod[k.Index] = v, kv.ModRevision
		}
	}
	return s, nil
}

// decodeStockKV parses a key under SKUStock and its counter value. A key
// that is not a counter of this SKU, or a segment beyond its count, is
// reported as corrupt: something other than stockctl wrote there.
func (e *Engine) decodeStockKV(sku *skuInfo, kv *mvccpb.KeyValue) (keys.StockKey, int64, error) {
	key := string(kv.Key)
	k, err := e.keys.ParseStock(key)
	if err == nil && k.SKU == sku.name && k.Index < sku.segments {
		v, err := DecodeCounter(key, kv.Value)
		return k, v, err
	}
	if err == nil {
		err = fmt.Errorf("segment %d of a SKU with %d segments", k.Index, sku.segments)
	}
	return k, 0, &CorruptError{Key: key, Value: kv.Value, Err: err}
}
