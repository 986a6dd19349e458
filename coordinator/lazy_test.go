package coordinator_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// keysWritten counts the keys put under prefix between two revisions, as
// etcd's history has them (every key a transaction puts is one event).
func keysWritten(t *testing.T, raw *clientv3.Client, prefix string, from, to int64) (puts int64) {
	t.Helper()
	if to <= from {
		return 0
	}
	w := raw.Watch(t.Context(), prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1))
	for resp := range w {
		if err := resp.Err(); err != nil {
			t.Fatal(err)
		}
		last := int64(0)
		for _, ev := range resp.Events {
			last = ev.Kv.ModRevision
			if ev.Kv.ModRevision <= to && ev.Type == clientv3.EventTypePut {
				puts++
			}
		}
		if last >= to {
			return puts
		}
	}
	t.Fatal("the watch ended before revision", to)
	return 0
}

// A served plain order over many SKUs writes one key, its record: the
// segments it is sold from are owned by the selling process for lazy
// sales, so their counters are written only when taken over and now and
// then (settles). 50 SKUs, 1,000 concurrent orders from one process: at
// most 1.3 keys written per order, counted by etcd itself, and every SKU's
// books balance with its segments counted from the records.
func TestLazyOrdersWriteAboutOneKey(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1, coordinator.WithLazySegments())[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	const skus, orders = 50, 1000
	for i := range skus {
		mustCreate(t, c, fmt.Sprintf("s%02d", i), coordinator.SKUConfig{Total: 400, Segments: 4, InitialFill: 400, LowWatermark: 5})
	}
	start, err := raw.Get(ctx, "rev")
	if err != nil {
		t.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for {
				n := next.Add(1)
				if n > orders {
					return
				}
				if _, err := c.Allocate(ctx, fmt.Sprintf("s%02d", n%skus), fmt.Sprintf("o%d", n), 1, ""); err != nil {
					t.Errorf("order %d: %v", n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	end, err := raw.Get(ctx, "rev")
	if err != nil {
		t.Fatal(err)
	}
	puts := keysWritten(t, raw, engines.Of(c).Keys.Prefix(), start.Header.Revision, end.Header.Revision)
	perOrder := float64(puts) / orders
	t.Logf("%d keys written for %d orders: %.3f a served order", puts, orders, perOrder)
	if puts < orders {
		t.Fatalf("%d keys written for %d orders: every order writes its record", puts, orders)
	}
	if perOrder > 1.3 {
		t.Fatalf("%.3f keys written per served order, want at most 1.3", perOrder)
	}
	for i := range skus {
		sku := fmt.Sprintf("s%02d", i)
		if rep := mustAudit(t, c, sku); rep.Allocated != orders/skus {
			t.Fatalf("%s: audit allocates %d, want %d", sku, rep.Allocated, orders/skus)
		}
		if st := mustStatus(t, c, sku); st.Allocated != orders/skus {
			t.Fatalf("%s: status allocates %d, want %d", sku, st.Allocated, orders/skus)
		}
	}
}

// A lazy segment changes hands without losing a sale: A sells from a
// 1-segment SKU lazily (its counter still says 99, written by its first order, while Status counts the
// records), B takes it over, A's next order takes it back, and A closes
// without settling: B sells on, and Status and Audit are exact at every
// step, the raw counter never the truth alone.
func TestLazySegmentChangesHands(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2, coordinator.WithLazySegments())
	raw := etcd.Client(t)
	ctx := t.Context()
	a, b := cs[0], cs[1]
	mustCreate(t, a, "one", coordinator.SKUConfig{Total: 100, Segments: 1, InitialFill: 100, LowWatermark: 1})
	counter := engines.Of(a).Keys.Segment("one", 0)
	raw0 := func() segments.SegmentCounter {
		c, _ := readSegmentCounter(t, raw, counter)
		return c
	}
	sold := 0
	sell := func(c *coordinator.Coordinator, n int) {
		t.Helper()
		for range n {
			sold++
			if _, err := c.Allocate(ctx, "one", fmt.Sprintf("o%d", sold), 1, ""); err != nil {
				t.Fatalf("order %d: %v", sold, err)
			}
		}
		if st := mustStatus(t, b, "one"); st.Allocated != int64(sold) || st.Remaining() != int64(100-sold) {
			t.Fatalf("after %d orders: status %+v", sold, st)
		}
		if rep := mustAudit(t, b, "one"); rep.Allocated != int64(sold) {
			t.Fatalf("after %d orders: audit %+v", sold, rep)
		}
	}
	sell(a, 10)
	// A's first order claimed the segment in its own commit (the counter
	// was exact and nobody's: 99 units, A's); the next 9 wrote no counter.
	if c := raw0(); c.N != 99 || c.Owner == 0 {
		t.Fatalf("after A's 10 lazy orders the counter is %+v, want N 99 (written by the first) with an owner", c)
	}
	ownerA := raw0().Owner
	sell(b, 5)
	if c := raw0(); c.Owner == ownerA || c.Owner == 0 {
		t.Fatalf("B sold without taking the segment over: %+v", c)
	}
	sell(a, 5)
	if c := raw0(); c.Owner != ownerA {
		t.Fatalf("A's order did not take the segment back: %+v", c)
	}
	a.Close()
	sell(b, 80)
	if st := mustStatus(t, b, "one"); st.Remaining() != 0 {
		t.Fatalf("sold out, status says %d remain", st.Remaining())
	}
	if _, err := b.Allocate(ctx, "one", "extra", 1, ""); err == nil {
		t.Fatal("an order beyond the total was served")
	}
}

// A coordinator that closes leaves the segments it sold lazily exact and
// ownerless: the rebalancer reads counters, not records, and a lazy
// counter's N only bounds what the segment holds. Before Close the raw
// counters over-count the stock (the records are what count); after it
// they hold exactly what is left, and the books balance.
func TestCloseSettlesLazySegments(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	raw := etcd.Client(t)
	cs := newCoordinators(t, etcd, 2, coordinator.WithLazySegments())
	seller, other := cs[0], cs[1]
	ctx := t.Context()
	const skus, perSKU, total = 3, 10, 40
	for i := range skus {
		mustCreate(t, seller, fmt.Sprint("s", i), coordinator.SKUConfig{Total: total, Segments: 2, InitialFill: total})
	}
	for i := range skus * perSKU {
		if _, err := seller.Allocate(ctx, fmt.Sprint("s", i%skus), fmt.Sprint("o", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	lazyCounters := func() (n int) {
		t.Helper()
		resp, err := raw.Get(ctx, seller.Prefix()+"stock/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if !strings.Contains(string(kv.Key), "/seg/") {
				continue
			}
			c, err := segments.DecodeSegmentCounter(string(kv.Key), kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			if c.Lazy() {
				n++
			}
		}
		return n
	}
	now := func() int64 {
		t.Helper()
		resp, err := raw.Get(ctx, "now")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	if lazyCounters() == 0 {
		t.Fatal("no segment sold lazily before Close: the test tests nothing")
	}
	if err := seller.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if n := lazyCounters(); n != 0 {
		t.Fatalf("%d segments still lazy after their seller closed", n)
	}
	rev := now()
	for i := range skus {
		sku := fmt.Sprint("s", i)
		if got := stockAt(t, raw, seller.Prefix(), sku, rev); got != total-perSKU {
			t.Errorf("%s: the raw counters hold %d after Close; want %d", sku, got, total-perSKU)
		}
		mustAudit(t, other, sku)
	}
}

// readSegmentCounter reads the segment counter at key as stored, and its
// ModRevision.
func readSegmentCounter(t *testing.T, raw *clientv3.Client, key string) (segments.SegmentCounter, int64) {
	t.Helper()
	resp, err := raw.Get(t.Context(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read the counter %s: %v", key, err)
	}
	c, err := segments.DecodeSegmentCounter(key, resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return c, resp.Kvs[0].ModRevision
}
