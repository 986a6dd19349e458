package keys

import (
	"strconv"
	"strings"
	"testing"
)

func TestLayout(t *testing.T) {
	s, err := New("/shop")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		s.Lock("report"):            "/shop/locks/report/",
		s.Meta("iphone"):            "/shop/meta/iphone",
		s.Pool("iphone"):            "/shop/stock/iphone/pool",
		s.Segment("iphone", 7):      "/shop/stock/iphone/seg/0007",
		s.Inbox("iphone", 1023):     "/shop/stock/iphone/in/1023",
		s.PoolLock("iphone"):        "/shop/stocklocks/iphone/pool/",
		s.SegmentLock("iphone", 12): "/shop/stocklocks/iphone/seg/0012/",
		s.Order("iphone", "o-1"):    "/shop/orders/iphone/o-1",
		s.OrderID("o-1"):            "/shop/orderid/o-1",
		s.Election():                "/shop/rebalance/election",
		s.RebalanceLast():           "/shop/rebalance/last",
		s.Delivery("iphone", "d-7"): "/shop/deliveries/iphone/d-7",
		s.DeliveryID("d-7"):         "/shop/deliveryid/d-7",
	}
	for got, want := range cases {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	// Segment keys sort in index order.
	if !(s.Segment("x", 9) < s.Segment("x", 10)) {
		t.Error("segment keys do not sort by index")
	}
	// No SKU's stock prefix contains another's.
	if strings.HasPrefix(s.SKUStock("ab"), s.SKUStock("a")) {
		t.Error("SKU prefixes overlap")
	}
}

func TestNewRejects(t *testing.T) {
	for _, p := range []string{"", "a\x00", "tab\t"} {
		if _, err := New(p); err == nil {
			t.Errorf("New(%q) accepted", p)
		}
	}
}

func TestParseStock(t *testing.T) {
	s, _ := New("/p/")
	good := []struct {
		key  string
		want StockKey
	}{
		{"/p/stock/a/pool", StockKey{SKU: "a", Kind: KindPool, Index: -1}},
		{"/p/stock/a/seg/0003", StockKey{SKU: "a", Kind: KindSegment, Index: 3}},
		{"/p/stock/a.b-c/in/1023", StockKey{SKU: "a.b-c", Kind: KindInbox, Index: 1023}},
	}
	for _, tc := range good {
		got, err := s.ParseStock(tc.key)
		if err != nil || got != tc.want {
			t.Errorf("ParseStock(%q) = %+v, %v; want %+v", tc.key, got, err, tc.want)
		}
	}
	for _, key := range []string{
		"/p/stock/a", "/p/stock//pool", "/p/stock/a/seg/3", "/p/stock/a/seg/00a3",
		"/p/stock/a/other/0001", "/q/stock/a/pool", "/p/stock/a/pool/x", "/p/stock/a/seg/0001/x",
	} {
		if k, err := s.ParseStock(key); err == nil {
			t.Errorf("ParseStock(%q) accepted: %+v", key, k)
		}
	}
}

// FuzzParseStock: parsing never panics, and whatever parses is rebuilt into
// the very same key (the layout has one spelling per counter).
func FuzzParseStock(f *testing.F) {
	s, _ := New("/p/")
	for _, k := range []string{"/p/stock/a/pool", "/p/stock/a/seg/0003", "/p/stock/x/in/9999", "/p/stock/a/seg/", "/p/stock/"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		k, err := s.ParseStock(key)
		if err != nil {
			return
		}
		var rebuilt string
		switch k.Kind {
		case KindPool:
			rebuilt = s.Pool(k.SKU)
		case KindSegment:
			rebuilt = s.Segment(k.SKU, k.Index)
		case KindInbox:
			rebuilt = s.Inbox(k.SKU, k.Index)
		}
		if rebuilt != key {
			t.Fatalf("ParseStock(%q) = %+v, which builds %q", key, k, rebuilt)
		}
	})
}

func FuzzParseMetaAndOrder(f *testing.F) {
	s, _ := New("/p/")
	f.Add("/p/meta/iphone", "iphone")
	f.Add("/p/orders/iphone/o1", "iphone")
	f.Add("/p/deliveries/iphone/d1", "iphone")
	f.Fuzz(func(t *testing.T, key, sku string) {
		if name, err := s.ParseMeta(key); err == nil && s.Meta(name) != key {
			t.Fatalf("ParseMeta(%q) = %q", key, name)
		}
		if id, err := s.ParseOrder(sku, key); err == nil && s.Order(sku, id) != key {
			t.Fatalf("ParseOrder(%q, %q) = %q", sku, key, id)
		}
		if id, err := s.ParseDelivery(sku, key); err == nil && s.Delivery(sku, id) != key {
			t.Fatalf("ParseDelivery(%q, %q) = %q", sku, key, id)
		}
	})
}

func TestParseStockLock(t *testing.T) {
	s, _ := New("/p/")
	good := []struct {
		key  string
		want StockLockKey
	}{
		{"/p/stocklocks/a/pool/1f", StockLockKey{SKU: "a", Kind: KindPool, Index: -1, Lease: 0x1f}},
		{"/p/stocklocks/a/seg/0003/694d9a2b5c2e4f07", StockLockKey{SKU: "a", Kind: KindSegment, Index: 3, Lease: 0x694d9a2b5c2e4f07}},
	}
	for _, tc := range good {
		got, err := s.ParseStockLock(tc.key)
		if err != nil || got != tc.want {
			t.Errorf("ParseStockLock(%q) = %+v, %v; want %+v", tc.key, got, err, tc.want)
		}
	}
	for _, key := range []string{
		"/p/stocklocks/a/pool/", "/p/stocklocks/a/pool/0f", "/p/stocklocks/a/pool/1F", "/p/stocklocks/a/pool/-1",
		"/p/stocklocks/a/seg/0003", "/p/stocklocks/a/seg/3/1f", "/p/stocklocks//pool/1f", "/p/stocks/a/pool/1f",
		"/p/stocklocks/a/seg/0003/1f/x", "/p/stocklocks/a/other/0003/1f",
	} {
		if k, err := s.ParseStockLock(key); err == nil {
			t.Errorf("ParseStockLock(%q) accepted: %+v", key, k)
		}
	}
}

// FuzzParseStockLock: parsing never panics, and whatever parses is rebuilt
// into the very same key.
func FuzzParseStockLock(f *testing.F) {
	s, _ := New("/p/")
	for _, k := range []string{"/p/stocklocks/a/pool/1f", "/p/stocklocks/a/seg/0003/abc", "/p/stocklocks/a/seg/", "/p/stocklocks/"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		k, err := s.ParseStockLock(key)
		if err != nil {
			return
		}
		rebuilt := s.PoolLock(k.SKU)
		if k.Kind == KindSegment {
			rebuilt = s.SegmentLock(k.SKU, k.Index)
		}
		rebuilt += strconv.FormatInt(k.Lease, 16)
		if rebuilt != key {
			t.Fatalf("ParseStockLock(%q) = %+v, which builds %q", key, k, rebuilt)
		}
	})
}
