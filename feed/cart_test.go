package feed_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// An order of several lines reaches the feed as one event per line, each
// carrying the order's SKUs (Lines), all lines of one transition at one
// revision and in one batch; a consumer that keeps a table of orders from
// the feed (each batch applied whole) ends with, per SKU, exactly the units
// the audit counts as allocated, after carts placed, reserved, confirmed,
// cancelled and released, and single-SKU orders beside them.
func TestCartEvents(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := etcd.Client(t)
	c := newCoordinator(t, client, coordinator.DefaultPrefix)
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	for _, s := range []string{"tee", "mug", "cap"} {
		createSKU(t, c, s, 100, 2)
	}
	three := []coordinator.Line{{SKU: "tee", Qty: 2}, {SKU: "mug", Qty: 1}, {SKU: "cap", Qty: 3}}
	two := []coordinator.Line{{SKU: "mug", Qty: 4}, {SKU: "tee", Qty: 1}}
	steps := []func() error{
		func() error { _, err := c.AllocateOrder(ctx, "c-1", three); return err },
		func() error { _, err := c.Allocate(ctx, "tee", "s-1", 5, ""); return err },
		func() error { _, err := c.ReserveOrder(ctx, "c-2", two, time.Hour); return err },
		func() error { _, err := c.ReserveOrder(ctx, "c-3", two, time.Hour); return err },
		func() error { _, err := c.ConfirmOrder(ctx, "tee", "c-2"); return err },
		func() error { _, err := c.CancelOrder(ctx, "mug", "c-3"); return err },
		func() error { _, err := c.AllocateOrder(ctx, "c-4", three); return err },
		func() error { _, err := c.ReleaseOrder(ctx, "cap", "c-4"); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}

	f, err := feed.Open(ctx, client, feed.Config{UntilOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type key struct{ sku, order string }
	table := map[key]feed.Event{} // each order line's latest event
	transitions := 0
	for {
		b, err := f.Next(ctx)
		if err != nil {
			break // io.EOF at the end (drain's checks are below)
		}
		// Every line of a transition is in this batch (a batch holds
		// whole revisions, maybe several).
		type group struct {
			rev   int64
			order string
		}
		seen := map[group][]string{}
		lines := map[group][]string{}
		for _, e := range b.Events {
			table[key{e.SKU, e.Order}] = e
			if e.Lines == nil {
				continue
			}
			g := group{e.Revision, e.Order}
			seen[g] = append(seen[g], e.SKU)
			lines[g] = e.Lines
		}
		for g, got := range seen {
			slices.Sort(got)
			if !slices.Equal(got, lines[g]) {
				t.Fatalf("batch at cursor %d holds lines %v of order %s at revision %d, whose lines are %v",
					b.Cursor, got, g.order, g.rev, lines[g])
			}
			transitions++
		}
	}
	if f.Cursor() == 0 {
		t.Fatal("the feed delivered nothing")
	}
	// allocated c-1, reserved c-2, reserved c-3, confirmed c-2, cancelled
	// c-3, allocated c-4, released c-4.
	if transitions != 7 {
		t.Fatalf("%d transitions of orders of several lines, want 7", transitions)
	}
	held := map[string]int64{}
	for k, e := range table {
		if e.Kind.Active() {
			held[k.sku] += e.Qty
		}
	}
	for _, s := range []string{"tee", "mug", "cap"} {
		rep, err := c.Audit(ctx, s)
		if err != nil || !rep.OK {
			t.Fatalf("audit %s: %+v, %v", s, rep, err)
		}
		if rep.Allocated != held[s] {
			t.Fatalf("%s: the feed's table holds %d, the audit %d", s, held[s], rep.Allocated)
		}
	}
}
