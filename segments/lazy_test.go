package segments

import (
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/keys"
)

// A lazy segment its owner left with unsettled sales (it sells elsewhere
// now, or is gone) would make every reader of the SKU read the whole sale
// since its base. A look that counts more records than staleLazyRecords
// since a segment's base settles that segment: its counter is written
// with its exact units, the books still balance, and its owner, coming
// back, takes it again and sells on.
func TestStaleLazySegmentIsSettled(t *testing.T) {
	defer func(n int) { staleLazyRecords = n }(staleLazyRecords)
	staleLazyRecords = 8

	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	lazy := func(c *engineTestConfig) { c.client, c.lazy = client, true }
	left, seller := etcdEngine(t, lazy), etcdEngine(t, lazy)
	ctx := t.Context()
	if _, err := left.CreateSKU(ctx, "s", SKUConfig{Total: 100, Segments: 2, InitialFill: 100}); err != nil {
		t.Fatal(err)
	}
	// left sells 3 orders and stops: its segment keeps 3 unsettled sales.
	for i := range 3 {
		if _, err := left.Allocate(ctx, "s", fmt.Sprint("left-", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	owned := lazyCounters(t, left, "s")
	stale, ok := owned[left.owner]
	if !ok {
		t.Fatalf("no segment owned by the first process after its orders: %v", owned)
	}
	// seller sells more than staleLazyRecords orders from the other
	// segment (one it owns: nobody owns it yet).
	for i := range 12 {
		if _, err := seller.Allocate(ctx, "s", fmt.Sprint("seller-", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	info, err := seller.sku(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := seller.look(ctx, info, ""); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "the stale segment to be settled", 30*time.Second, func() bool {
		return len(lazyCounters(t, seller, "s")) == 0 // the seller's own too: 12 records since its base
	})
	audit := func(when string) {
		rep, err := seller.Audit(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK {
			t.Fatalf("%s: the books do not balance: %+v", when, rep)
		}
	}
	audit("after the settle")
	// The exact units of the settled segment: its fill less the 3 sales.
	resp, err := client.Get(ctx, left.counterKey("s", Segment(stale)))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read segment %d: %v", stale, err)
	}
	c, err := DecodeSegmentCounter(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if c.Lazy() || c.N != 50-3 {
		t.Fatalf("segment %d after the settle: %+v; want exactly 47 units, not lazy", stale, c)
	}
	// The first process sells again: its commit finds the counter moved,
	// and it takes a segment again.
	for i := range 3 {
		if _, err := left.Allocate(ctx, "s", fmt.Sprint("left-again-", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	audit("after the first process sold again")
	rep, err := seller.Audit(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rep.Allocated, int64(3+12+3); got != want {
		t.Fatalf("allocated %d; want %d", got, want)
	}
}

// lazyCounters maps the owner of each of sku's lazy segments to its index.
func lazyCounters(t *testing.T, e *Engine, sku string) map[int64]int {
	t.Helper()
	info, err := e.sku(t.Context(), sku)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.client.Get(t.Context(), e.keys.SKUStock(sku), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	owners := map[int64]int{}
	for _, kv := range resp.Kvs {
		k, c, err := e.decodeStockKV(info, kv)
		if err != nil {
			t.Fatal(err)
		}
		if k.Kind == keys.KindSegment && c.Lazy() {
			owners[c.Owner] = k.Index
		}
	}
	return owners
}

// A look at a SKU with another process's lazy segment counts its sales
// from the records since the segment's base. The first look learns the
// base and reads them in a second transaction; the next ones read them in
// the look's own transaction, at the same revision, and count exactly the
// same. A base older than the one remembered (here: forced) goes back to
// the second read, and counts right too.
func TestLookReadsLazySalesInOneTransaction(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	lazy := func(c *engineTestConfig) { c.client, c.lazy = client, true }
	seller, reader := etcdEngine(t, lazy), etcdEngine(t, lazy)
	ctx := t.Context()
	if _, err := seller.CreateSKU(ctx, "s", SKUConfig{Total: 100, Segments: 2, InitialFill: 60}); err != nil {
		t.Fatal(err)
	}
	sold := 0
	sell := func(n int) {
		t.Helper()
		for range n {
			if _, err := seller.Allocate(ctx, "s", fmt.Sprint("o-", sold), 1, ""); err != nil {
				t.Fatal(err)
			}
			sold++
		}
	}
	sell(3)
	if len(lazyCounters(t, seller, "s")) == 0 {
		t.Fatal("no lazy segment after the seller's orders: the test sells nothing lazily")
	}
	info, err := reader.sku(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	look := func(wantRereads int64) {
		t.Helper()
		before := reader.lookRereads.Load()
		snap, _, err := reader.look(ctx, info, "")
		if err != nil {
			t.Fatal(err)
		}
		if got := snap.total(); got != int64(100-sold) {
			t.Errorf("after %d orders the look counts %d units; want %d", sold, got, 100-sold)
		}
		if got := reader.lookRereads.Load() - before; got != wantRereads {
			t.Errorf("after %d orders the look took %d second reads; want %d", sold, got, wantRereads)
		}
	}
	look(1) // learns the base
	sell(2)
	look(0)
	sell(4)
	look(0)
	// A remembered base later than the segment's: the look's own read
	// would miss records, so it reads again.
	info.lookBase.Store(info.lookBase.Load() + 1_000_000)
	look(1)
	look(0)
}

// A look reads the records since the lazy base its last look remembered
// in its own transaction only soon after that look, and only up to
// specReadLimit of them: etcd reads every record of the SKU to answer such
// a read and returns all those since the base. A base remembered long ago,
// on a SKU whose lazy segments have been settled since, cost every look
// the whole sale since it; a truncated read is not used (a second read
// counts the lazy segments). Every look counts the units right.
func TestLookReadsRecordsSinceAnOldBaseOnlyWhenItMust(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	tests := []struct {
		name     string
		settle   bool          // the seller settles its lazy segments before the look
		age      time.Duration // how long ago the remembered look was
		limit    int           // staleLazyRecords during the look (0: as it is)
		rereads  int64
		records  func(sinceBase int64) (lo, hi int64) // records the look's reads return
		wantLazy bool
	}{
		{name: "settled, remembered a moment ago", settle: true,
			records: func(n int64) (int64, int64) { return n, n }},
		{name: "settled, remembered long ago", settle: true, age: 2 * lookBaseFresh,
			records: func(int64) (int64, int64) { return 0, 0 }},
		// No speculative read: the second one reads the records since the
		// segment's base now (a settle at the low watermark moved it), no
		// more than those since the remembered one.
		{name: "lazy, remembered long ago", age: 2 * lookBaseFresh, rereads: 1, wantLazy: true,
			records: func(n int64) (int64, int64) { return 0, n }},
		// The speculative read returns specReadLimit records and is not
		// used; the second one reads those since the base now.
		{name: "lazy, more since the base than a speculative read returns", limit: 5, rereads: 1, wantLazy: true,
			records: func(n int64) (int64, int64) { return 6, 6 + n }},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lazy := func(c *engineTestConfig) { c.client, c.lazy = client, true }
			seller, reader := etcdEngine(t, lazy), etcdEngine(t, lazy)
			ctx := t.Context()
			sku := fmt.Sprint("s", i)
			if _, err := seller.CreateSKU(ctx, sku, SKUConfig{Total: 100, Segments: 2, InitialFill: 60}); err != nil {
				t.Fatal(err)
			}
			sold := 0
			sell := func(n int) {
				t.Helper()
				for range n {
					if _, err := seller.Allocate(ctx, sku, fmt.Sprint("o-", sold), 1, ""); err != nil {
						t.Fatal(err)
					}
					sold++
				}
			}
			info, err := reader.sku(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			look := func() {
				t.Helper()
				snap, _, err := reader.look(ctx, info, "")
				if err != nil {
					t.Fatal(err)
				}
				if got := snap.total(); got != int64(100-sold) {
					t.Errorf("after %d orders the look counts %d units; want %d", sold, got, 100-sold)
				}
			}
			sell(3)
			look() // remembers the lazy base
			base := info.lookBase.Load()
			if base == 0 {
				t.Fatal("the first look remembered no lazy base: the test sells nothing lazily")
			}
			sell(20)
			if tc.settle {
				if n, err := seller.SettleOwned(ctx); err != nil || n == 0 {
					t.Fatalf("SettleOwned = %d, %v; want the seller's lazy segment written", n, err)
				}
			}
			resp, err := client.Get(ctx, reader.keys.Orders(sku), clientv3.WithPrefix(), clientv3.WithMinCreateRev(base+1), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatal(err)
			}
			sinceBase := int64(len(resp.Kvs))
			info.lookBaseAt.Store(time.Now().Add(-tc.age).UnixNano())
			if tc.limit > 0 {
				defer func(n int) { staleLazyRecords = n }(staleLazyRecords)
				staleLazyRecords = tc.limit
			}
			rereads, records := reader.lookRereads.Load(), reader.lookRecords.Load()
			look()
			if got := info.lookBase.Load() != 0; got != tc.wantLazy {
				t.Errorf("the look found lazy segments: %v; want %v", got, tc.wantLazy)
			}
			if got := reader.lookRereads.Load() - rereads; got != tc.rereads {
				t.Errorf("the look took %d second reads; want %d", got, tc.rereads)
			}
			lo, hi := tc.records(sinceBase)
			if got := reader.lookRecords.Load() - records; got < lo || got > hi {
				t.Errorf("the look's reads returned %d records (%d since the remembered base); want %d to %d", got, sinceBase, lo, hi)
			}
		})
	}
}
