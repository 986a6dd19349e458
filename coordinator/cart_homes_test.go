package coordinator_test

import (
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// A cart whose every line its home segment and its SKU's pool can serve is
// planned on a read of those counters only, not of every counter of its
// SKUs; one that needs more (other segments), a replay and a refusal are
// decided on a full read, as before: served from elsewhere, replayed,
// refused truly. The books balance throughout.
func TestCartReadsHomesFirst(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	var reads txnCounter // prefix reads of stock/h1/: every counter of the SKU
	c := interceptedCoordinator(t, etcd, reads.intercept)
	ctx := t.Context()
	mustCreate(t, c, "h1", coordinator.SKUConfig{Total: 1000, Segments: 4, InitialFill: 400})
	mustCreate(t, c, "h2", coordinator.SKUConfig{Total: 1000, Segments: 4, InitialFill: 400})
	reads.arm(rangesOf(engines.Of(c).Keys.SKUStock("h1"), func(r *etcdserverpb.RangeRequest) bool { return len(r.RangeEnd) > 0 }))

	small := []coordinator.Line{{SKU: "h1", Qty: 2}, {SKU: "h2", Qty: 3}}
	if _, err := c.AllocateOrder(ctx, "small", small); err != nil {
		t.Fatal(err)
	}
	if n := reads.n.Load(); n != 0 {
		t.Errorf("a cart its homes can serve read every counter of h1 %d times; want none", n)
	}

	// 750 of h1: more than its home segment (100) and its pool (600)
	// hold, so other segments give the rest, found by a full read.
	big, err := c.AllocateOrder(ctx, "big", []coordinator.Line{{SKU: "h1", Qty: 750}, {SKU: "h2", Qty: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(big.Lines[0].Parts) < 3 {
		t.Errorf("750 units from fewer than three places: %+v", big.Lines[0].Parts)
	}
	if reads.n.Load() == 0 {
		t.Error("a cart its homes cannot serve was served without a full read")
	}

	before := reads.n.Load()
	again, err := c.AllocateOrder(ctx, "small", small)
	if err != nil || !again.Replayed {
		t.Fatalf("a retry of the first cart: %+v, %v; want it replayed", again, err)
	}
	if reads.n.Load() == before {
		t.Error("a replay was answered without a full read")
	}
	_, err = c.AllocateOrder(ctx, "huge", []coordinator.Line{{SKU: "h1", Qty: 300}, {SKU: "h2", Qty: 1}})
	var le *coordinator.LineError
	var short *coordinator.InsufficientStockError
	if !errors.As(err, &le) || le.SKU != "h1" || !errors.As(err, &short) || short.Remaining != 248 {
		t.Fatalf("300 of the 248 left: %v; want an insufficient-stock refusal of line h1 saying 248 remain", err)
	}
	if got := auditAll(t, c, "h1", "h2"); got["h1"] != 752 || got["h2"] != 4 {
		t.Fatalf("allocated: %v; want h1 752, h2 4", got)
	}
}

// A cart on a SKU whose segment another process sells lazily (its sales
// are records the counter does not show yet) is served from the places it
// may take from without reading those records: that read ranges the SKU's
// whole order history, and beside single orders it made carts 6x slower.
// A line the lazy sales may leave short is judged on exact counts (the
// records read at the view's revision): refused with what truly remains,
// or served under the places' locks when enough does. The books balance.
func TestCartBesideLazySegments(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	var reads txnCounter // reads of lz's records since a base: its unsettled sales
	a := interceptedCoordinator(t, etcd, reads.intercept)
	b := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, a, "lz", coordinator.SKUConfig{Total: 100, Segments: 1, InitialFill: 60})
	mustCreate(t, a, "other", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100})
	for i := range 10 {
		if _, err := b.Allocate(ctx, "lz", fmt.Sprint("b-", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	if c, _ := readSegmentCounter(t, raw, engines.Of(a).Keys.Segment("lz", 0)); !c.Lazy() || c.N <= 50 {
		t.Fatalf("the segment after B's 10 orders: %+v; want lazy, its N above the 50 it holds (else the test proves nothing)", c)
	}
	reads.arm(rangesOf(engines.Of(a).Keys.Orders("lz"), func(r *etcdserverpb.RangeRequest) bool { return r.MinCreateRevision > 0 }))

	// 60 of other need both its segments (50 each, no pool): the cart is
	// planned on a full read of both SKUs.
	c1, err := a.AllocateOrder(ctx, "c1", []coordinator.Line{{SKU: "lz", Qty: 5}, {SKU: "other", Qty: 60}})
	if err != nil {
		t.Fatal(err)
	}
	if n := reads.n.Load(); n != 0 {
		t.Errorf("a cart the pool could serve read the SKU's records %d times; want none", n)
	}
	if p := c1.Lines[1].Parts; len(p) != 2 {
		t.Errorf("the 60 of other came from %v; want both segments (else no full read was needed)", p)
	}
	if p := c1.Lines[0].Parts; len(p) != 1 || !p[0].Place.IsPool() {
		t.Errorf("the lz line took %v; want the pool's (the segment is another's lazily)", p)
	}

	// 95 more: at most 59 + 35 by the counters, 50 + 35 = 85 truly.
	_, err = a.AllocateOrder(ctx, "c2", []coordinator.Line{{SKU: "lz", Qty: 95}, {SKU: "other", Qty: 1}})
	var short *coordinator.InsufficientStockError
	if !errors.As(err, &short) || short.Remaining != 85 {
		t.Fatalf("95 of 85 left: %v; want a refusal saying 85 remain", err)
	}
	if reads.n.Load() == 0 {
		t.Error("a refusal was judged without counting the lazy segment's sales")
	}
	// 80: the counters' upper bound does not refuse it, the pool alone
	// cannot serve it, so it is judged exactly and served under locks.
	c3, err := a.AllocateOrder(ctx, "c3", []coordinator.Line{{SKU: "lz", Qty: 80}, {SKU: "other", Qty: 1}})
	if err != nil {
		t.Fatalf("80 of 85 left: %v", err)
	}
	if len(c3.Lines[0].Parts) != 2 {
		t.Errorf("the 80 came from %v; want the pool and the segment", c3.Lines[0].Parts)
	}
	_, err = a.AllocateOrder(ctx, "c4", []coordinator.Line{{SKU: "lz", Qty: 6}, {SKU: "other", Qty: 1}})
	if !errors.As(err, &short) || short.Remaining != 5 {
		t.Fatalf("6 of 5 left: %v; want a refusal saying 5 remain", err)
	}
	if got := auditAll(t, a, "lz", "other"); got["lz"] != 95 || got["other"] != 61 {
		t.Fatalf("allocated: %v; want lz 95, other 61", got)
	}
}
