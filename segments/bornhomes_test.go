package segments

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/seats"
)

// lazySeller is a lazy engine on client that claims its seat at start
// (Config.SeatAtStart), as a selling service's coordinator does; it fails
// the test if the seat is not held.
func lazySeller(t *testing.T, client *clientv3.Client) *Engine {
	t.Helper()
	e := etcdEngine(t, func(c *engineTestConfig) { c.client, c.lazy, c.seatAtStart = client, true, true })
	etcdtest.WaitFor(t, "the seller's seat", 10*time.Second, func() bool { return e.seat.Index() >= 0 })
	return e
}

// counterOf reads segment i of sku: its counter and ModRevision.
func counterOf(t *testing.T, e *Engine, sku string, i int) (SegmentCounter, int64) {
	t.Helper()
	resp, err := e.client.Get(t.Context(), e.keys.Segment(sku, i))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read segment %d of %s: %v (%d keys)", i, sku, err, len(resp.Kvs))
	}
	c, err := DecodeSegmentCounter(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return c, resp.Kvs[0].ModRevision
}

func etcdRev(t *testing.T, e *Engine) int64 {
	t.Helper()
	resp, err := e.client.Get(t.Context(), "rev")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// A SKU created while a lazy seller holds its seat is born with the
// seller's home segment named to it (CreateSKU's bornHomes): the seller's
// first orders there write their records and nothing else (no takeover,
// no claim), the counter is never written, and every reader counts the
// segment right. A seat whose holder names no owner (an eager engine, or
// a binary older than the seat's value) gets no home: its first order
// claims the segment as before (the control: two keys).
func TestBornHomeFirstOrdersWriteOnlyTheirRecords(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lazy      bool
		seatAfter bool // the seller's seat is claimed after the SKU is created
		wantKeys  int  // keys written by the 5 orders
	}{
		{name: "lazy seller", lazy: true, wantKeys: 5},
		{name: "lazy seller seated after the creation", lazy: true, seatAfter: true, wantKeys: 6}, // a claim
		{name: "eager seller", lazy: false, wantKeys: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
			creator := etcdEngine(t, func(c *engineTestConfig) { c.client, c.lazy = client, true })
			seller := etcdEngine(t, func(c *engineTestConfig) { c.client, c.lazy, c.seatAtStart = client, tc.lazy, !tc.seatAfter })
			ctx := t.Context()
			const sku = "born"
			if !tc.seatAfter {
				etcdtest.WaitFor(t, "the seller's seat", 10*time.Second, func() bool { return seller.seat.Index() >= 0 })
			}
			if _, err := creator.CreateSKU(ctx, sku, SKUConfig{Total: 100, Segments: 4, InitialFill: 100}); err != nil {
				t.Fatal(err)
			}
			if tc.seatAfter {
				seller.seat.Start()
				etcdtest.WaitFor(t, "the seller's seat", 10*time.Second, func() bool { return seller.seat.Index() >= 0 })
			}
			home := seats.Home(sku, seller.seat.Index(), 4)
			for i := range 4 {
				c, _ := counterOf(t, creator, sku, i)
				wantOwner := int64(0)
				if tc.lazy && !tc.seatAfter && i == home {
					wantOwner = seller.owner
				}
				if c.N != 25 || c.Owner != wantOwner || c.Base != 0 {
					t.Fatalf("segment %d born as %+v; want 25 units, owner %x (the seller's home is %d)", i, c, wantOwner, home)
				}
			}
			_, bornMod := counterOf(t, creator, sku, home)
			from := etcdRev(t, seller)
			for i := range 5 {
				a, err := seller.Allocate(ctx, sku, fmt.Sprint("o", i), 1, "")
				if err != nil {
					t.Fatal(err)
				}
				if len(a.Parts) != 1 || a.Parts[0].Place != Segment(home) {
					t.Fatalf("order %d sold from %+v; want the seller's home, segment %d", i, a.Parts, home)
				}
			}
			if got := len(etcdtest.KeysPut(t, seller.client, seller.keys.Prefix(), from, etcdRev(t, seller))); got != tc.wantKeys {
				t.Fatalf("5 first orders wrote %d keys; want %d", got, tc.wantKeys)
			}
			if c, mod := counterOf(t, creator, sku, home); tc.lazy && !tc.seatAfter && (mod != bornMod || c.N != 25) {
				t.Fatalf("the born home's counter was written: %+v at %d, born at %d", c, mod, bornMod)
			}
			for _, e := range []*Engine{creator, seller} {
				if st, err := e.Status(ctx, sku); err != nil || st.Remaining() != 95 {
					t.Fatalf("status: %+v, %v; want 95 left", st, err)
				}
				if r, err := e.Audit(ctx, sku); err != nil || !r.OK || r.Allocated != 5 {
					t.Fatalf("audit: %+v, %v", r, err)
				}
			}
		})
	}
}

// A born home is adopted once: after the seller's caches of the SKU are
// forgotten (the reaper), the counter still names it at its birth
// revision, with its lazy sales since in records only. Adopting it again
// at its N would sell them twice; the seller must count them (a takeover)
// instead. Sold out from there, it serves exactly the fill, and refuses.
func TestBornHomeAdoptedOnce(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	seller := lazySeller(t, client)
	ctx := t.Context()
	const sku, fill = "once", 10
	if _, err := seller.CreateSKU(ctx, sku, SKUConfig{Total: fill, Segments: 1, InitialFill: fill}); err != nil {
		t.Fatal(err)
	}
	if c, _ := counterOf(t, seller, sku, 0); c.Owner != seller.owner {
		t.Fatalf("the one segment was born %+v, not named to the seller", c)
	}
	served := 0
	for i := range 4 {
		if _, err := seller.Allocate(ctx, sku, fmt.Sprint("a", i), 1, ""); err != nil {
			t.Fatal(err)
		}
		served++
	}
	if _, mod := counterOf(t, seller, sku, 0); mod >= etcdRev(t, seller)-3 {
		t.Fatalf("the counter was written by the lazy orders (ModRevision %d)", mod)
	}
	etcdtest.WaitFor(t, "the idle seller to be forgotten", 30*time.Second, func() bool {
		seller.evictIdle(time.Now().Add(2 * time.Hour))
		sellers, places, _, _ := seller.footprint()
		return sellers == 0 && places == 0
	})
	for i := 0; ; i++ {
		_, err := seller.Allocate(ctx, sku, fmt.Sprint("b", i), 1, "")
		var short *InsufficientStockError
		if errors.As(err, &short) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if served++; served > fill {
			t.Fatalf("served %d orders of %d units", served, fill)
		}
	}
	if served != fill {
		t.Fatalf("served %d orders, then refused; want the whole fill, %d", served, fill)
	}
	if r, err := seller.Audit(ctx, sku); err != nil || !r.OK || r.Allocated != fill {
		t.Fatalf("audit: %+v, %v", r, err)
	}
}

// Two sellers whose homes a SKU was born with sell it out together, many
// orders at once, each taking the other's home when its own is dry (a
// takeover that counts the other's records, and fails its next lazy
// commit): every unit is sold once, none twice, and the books balance.
// A third home is named to a process that has gone (a seat key whose
// holder never sells): its units are sold too, by a takeover.
func TestBornHomesSellOutTogether(t *testing.T) {
	client := etcdtest.NewSingle(t, etcdtest.WithNoFsync()).Client(t)
	a := lazySeller(t, client)
	b := lazySeller(t, client)
	if a.seat.Index() == b.seat.Index() {
		t.Fatalf("both sellers hold seat %d", a.seat.Index())
	}
	// A gone process's seat, under a lease of the test's: a home named to
	// an owner nobody is.
	lease, err := client.Grant(t.Context(), 60)
	if err != nil {
		t.Fatal(err)
	}
	ghost := max(a.seat.Index(), b.seat.Index()) + 1
	if _, err := client.Put(t.Context(), a.keys.SellersPrefix()+strconv.Itoa(ghost), "abcdef123", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const sku, total = "together", 120
	if _, err := a.CreateSKU(ctx, sku, SKUConfig{Total: total, Segments: 4, InitialFill: total}); err != nil {
		t.Fatal(err)
	}
	named := 0
	for i := range 4 {
		if c, _ := counterOf(t, a, sku, i); c.Owner != 0 {
			named++
		}
	}
	if named != 3 {
		t.Fatalf("%d homes named; want 3 (two sellers and the gone one)", named)
	}
	var served, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		e := []*Engine{a, b}[g%2]
		wg.Go(func() {
			for i := 0; ; i++ {
				_, err := e.Allocate(ctx, sku, fmt.Sprintf("g%d-%d", g, i), 1, "")
				var short *InsufficientStockError
				switch {
				case errors.As(err, &short):
					refused.Add(1)
					return
				case err != nil:
					t.Error(err)
					return
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	if served.Load() != total {
		t.Fatalf("served %d orders of %d units (%d goroutines refused)", served.Load(), total, refused.Load())
	}
	for _, e := range []*Engine{a, b} {
		if r, err := e.Audit(ctx, sku); err != nil || !r.OK || r.Allocated != total {
			t.Fatalf("audit: %+v, %v", r, err)
		}
	}
}
