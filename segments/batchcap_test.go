package segments

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// directBatch creates sku with segs segments on e and returns, for each of
// n orders, a request taking one unit directly from segment i mod segs, as
// a direct seller's cache holds the segments (exact counters nobody owns,
// seen under the SKU's incarnation); lean marks every part lean, whatever
// the place. move, when set, writes segment 0's counter again after the
// caches were read (the same units: another writer moved it).
func directBatch(t *testing.T, e *Engine, client *clientv3.Client, sku string, segs, n int, lean, move bool) []*commitReq {
	t.Helper()
	ctx := t.Context()
	if _, err := e.CreateSKU(ctx, sku, SKUConfig{Total: 1000, Segments: segs, InitialFill: 1000}); err != nil {
		t.Fatal(err)
	}
	info, err := e.sku(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	sts := make([]*placeState, segs)
	for seg := range segs {
		sts[seg] = directCacheOf(t, e, client, sku, seg, info.created)
	}
	var batch []*commitReq
	for i := range n {
		st := sts[i%segs]
		if ok, _ := st.reserveDirect(1, 0, 0); !ok {
			t.Fatalf("segment %v cannot give 1 unit: %+v", st.place, st.direct)
		}
		req := &allocReq{sku: info, order: fmt.Sprint(sku, "-order-", i), qty: 1}
		part := commitPart{st: st, qty: 1, direct: true, lockPfx: e.keys.SegmentLock(sku, int(st.place)), lean: lean}
		batch = append(batch, &commitReq{req: req, parts: []commitPart{part}, ctx: ctx, done: make(chan struct{})})
	}
	if move {
		resp, err := client.Get(ctx, sts[0].key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Put(ctx, sts[0].key, string(resp.Kvs[0].Value)); err != nil {
			t.Fatal(err)
		}
	}
	return batch
}

// directCacheOf reads segment seg of sku and returns its place as a direct
// seller's cache holds it (its counter exact and nobody's), seen under the
// incarnation verified (0: unverified, as a peek leaves it).
func directCacheOf(t *testing.T, e *Engine, client *clientv3.Client, sku string, seg int, verified int64) *placeState {
	t.Helper()
	key := e.counterKey(sku, Segment(seg))
	resp, err := client.Get(t.Context(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read segment %d: %v", seg, err)
	}
	c, err := DecodeSegmentCounter(key, resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return &placeState{sku: sku, place: Segment(seg), key: key, inKey: e.keys.Inbox(sku, seg),
		direct: directState{known: true, value: c.N, mod: resp.Kvs[0].ModRevision, raw: c, verified: verified}}
}

// smallTxnEngine is an engine on an embedded etcd whose --max-txn-ops is
// limit, told so.
func smallTxnEngine(t *testing.T, limit int) (*Engine, *clientv3.Client) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithMaxTxnOps(uint(limit))).Client(t)
	e := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
	e.cfg.MaxTxnOps = limit
	return e, client
}

// A batch selected on lean costs (one compare and one put a place) whose
// places turn out to cost more when planned (here: exact counters nobody
// owns, each compared with its lock's range and written) no longer fits
// etcd's --max-txn-ops: it is planned again in halves, every order served,
// none failed by etcd's "too many operations". Without the halving the one
// transaction is rejected and every order fails.
func TestBatchThatOutgrowsItsSelectionIsSplit(t *testing.T) {
	const limit = 10
	e, client := smallTxnEngine(t, limit)
	queue := directBatch(t, e, client, "outgrown", 8, 8, true, false)
	batch, rest := e.direct.selectBatch(queue)
	// Lean: each order 1 + 1 compares (its place fences its SKU): five
	// fit 10. Planned, each place compares its counter and its lock's
	// range: 5 x 3 = 15 compares.
	if len(batch) != 5 || len(rest) != 3 {
		t.Fatalf("selected %d, left %d; want 5 and 3", len(batch), len(rest))
	}
	e.direct.commit(t.Context(), batch)
	revs := map[int64]bool{}
	for _, cr := range batch {
		r := answered(cr)
		if r == nil || r.kind != resServed {
			t.Fatalf("order %s: %+v; want served", cr.req.order, r)
		}
		revs[r.alloc.Revision] = true
	}
	if len(revs) < 2 {
		t.Errorf("the five orders committed at %d revision(s); want the batch split over at least 2", len(revs))
	}
	for seg := range 5 {
		resp, err := client.Get(t.Context(), e.counterKey("outgrown", Segment(seg)))
		if err != nil {
			t.Fatal(err)
		}
		c, err := DecodeSegmentCounter(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(1000/8 - 1); c.N != want {
			t.Errorf("segment %d holds %d after one order; want %d", seg, c.N, want)
		}
	}
}

// A refused group whose Else reads outnumber --max-txn-ops is still read,
// in two read-only transactions at the refused answer's revision, and its
// orders answered for what refused them (the segment raced: they climb
// the ladder) rather than sent again blind. Before, the one read
// transaction was rejected by etcd and the orders were sent again.
func TestRefusedReadsSpanTransactions(t *testing.T) {
	const limit = 10
	e, client := smallTxnEngine(t, limit)
	// Seven orders on one segment: 7 + 2 compares and 7 + 1 puts fit;
	// the reads (counter, inbox, lock range, 7 records, the SKU's meta)
	// are 11.
	batch := directBatch(t, e, client, "reads", 1, 7, false, true)
	again, deferred := e.direct.commitOnce(context.Background(), batch)
	if len(again) != 0 || len(deferred) != 0 {
		t.Fatalf("%d orders to send again, %d deferred; want every order answered from the reads", len(again), len(deferred))
	}
	for _, cr := range batch {
		if r := answered(cr); r == nil || r.kind != resShort || !r.raced {
			t.Fatalf("order %s: %+v; want answered raced", cr.req.order, r)
		}
	}
}
