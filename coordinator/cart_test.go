package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// readRecord reads and decodes an order record (ok false when absent).
func readRecord(t *testing.T, c *coordinator.Coordinator, sku, order string) (segments.Order, int64, bool) {
	t.Helper()
	key := engines.Of(c).Keys.Order(sku, order)
	resp, err := engines.Of(c).Client.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return segments.Order{}, 0, false
	}
	o, err := segments.DecodeOrder(key, resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return o, resp.Kvs[0].ModRevision, true
}

// auditAll audits every SKU and returns what each has allocated.
func auditAll(t *testing.T, c *coordinator.Coordinator, skus ...string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, s := range skus {
		out[s] = mustAudit(t, c, s).Allocated
	}
	return out
}

// Invariants of an order of several lines, step by step on real etcd:
// every line is deducted in one transaction (one revision, a record per
// line listing every SKU); a retry replays the whole first outcome; a
// retry with other lines, another qty or as a single-SKU order is
// ErrConflict; a refusal names the line that could not be served, is true
// at its revision and deducts nothing; ReleaseOrder (and a plain Release of
// any one line) returns every line; the books of every SKU balance after
// every step.
func TestCartLifecycle(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, c, "phone", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 4})
	mustCreate(t, c, "case", coordinator.SKUConfig{Total: 5, Segments: 3, InitialFill: 5})
	mustCreate(t, c, "cable", coordinator.SKUConfig{Total: 3, Segments: 1})
	skus := []string{"phone", "case", "cable"}
	lines := []coordinator.Line{{SKU: "phone", Qty: 7}, {SKU: "case", Qty: 4}, {SKU: "cable", Qty: 1}}

	a, err := c.AllocateOrder(ctx, "o-1", lines)
	if err != nil {
		t.Fatal(err)
	}
	if a.Replayed || len(a.Lines) != 3 {
		t.Fatalf("allocate: %+v", a)
	}
	for i, l := range a.Lines {
		var got int64
		for _, p := range l.Parts {
			got += p.Qty
		}
		if l.SKU != lines[i].SKU || l.Qty != lines[i].Qty || got != l.Qty || l.Revision != a.Revision {
			t.Fatalf("line %d: %+v, want %v at revision %d", i, l, lines[i], a.Revision)
		}
		o, _, ok := readRecord(t, c, l.SKU, "o-1")
		if !ok || !slices.Equal(o.Lines, []string{"cable", "case", "phone"}) || o.Qty != l.Qty {
			t.Fatalf("record of %s: %+v (found %v)", l.SKU, o, ok)
		}
	}
	if got := auditAll(t, c, skus...); got["phone"] != 7 || got["case"] != 4 || got["cable"] != 1 {
		t.Fatalf("allocated after the order: %v", got)
	}

	// A retry, lines in another order, replays the first outcome whole.
	again, err := c.AllocateOrder(ctx, "o-1", []coordinator.Line{lines[2], lines[0], lines[1]})
	if err != nil || !again.Replayed || again.Revision != a.Revision || again.Lines[1].SKU != "phone" ||
		!slices.Equal(again.Lines[1].Parts, a.Lines[0].Parts) {
		t.Fatalf("retry: %+v, %v", again, err)
	}
	before := stateKeys(t, raw)
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"other qty", func() error {
			_, err := c.AllocateOrder(ctx, "o-1", []coordinator.Line{{SKU: "phone", Qty: 6}, lines[1], lines[2]})
			return err
		}},
		{"fewer lines", func() error { _, err := c.AllocateOrder(ctx, "o-1", lines[:2]); return err }},
		{"as a reservation", func() error { _, err := c.ReserveOrder(ctx, "o-1", lines, time.Hour); return err }},
		{"another buyer", func() error {
			_, err := c.AllocateOrder(ctx, "o-1", lines, coordinator.WithBuyer("b"))
			return err
		}},
		{"single-SKU order of a line", func() error { _, err := c.Allocate(ctx, "case", "o-1", 4, ""); return err }},
	} {
		if err := tc.call(); !errors.Is(err, coordinator.ErrConflict) {
			t.Errorf("%s: %v, want ErrConflict", tc.name, err)
		}
	}

	// The second line cannot be served: refused, naming it, nothing written.
	_, err = c.AllocateOrder(ctx, "o-2", []coordinator.Line{{SKU: "phone", Qty: 3}, {SKU: "case", Qty: 2}, {SKU: "cable", Qty: 1}})
	var le *coordinator.LineError
	var ise *coordinator.InsufficientStockError
	if !errors.As(err, &le) || le.Index != 1 || le.SKU != "case" || !errors.As(err, &ise) || ise.Remaining != 1 ||
		!errors.Is(err, coordinator.ErrInsufficientStock) {
		t.Fatalf("order with a short line: %v", err)
	}
	if rep, err := c.AuditAt(ctx, "case", ise.Revision); err != nil || rep.Pool+rep.Segments != ise.Remaining {
		t.Fatalf("at the refusal's revision %d the case SKU held %+v (%v), the refusal says %d", ise.Revision, rep, err, ise.Remaining)
	}
	sameKeys(t, "a refused order", before, stateKeys(t, raw))

	// A plain Release of one line returns the whole order.
	r, err := c.Release(ctx, "case", "o-1")
	if err != nil || !r.Released || r.SKU != "case" || r.Qty != 4 {
		t.Fatalf("release of one line: %+v, %v", r, err)
	}
	if got := auditAll(t, c, skus...); got["phone"] != 0 || got["case"] != 0 || got["cable"] != 0 {
		t.Fatalf("allocated after the release: %v", got)
	}
	for _, s := range skus {
		if o, _, _ := readRecord(t, c, s, "o-1"); !o.Released {
			t.Fatalf("line %s not marked released: %+v", s, o)
		}
	}
	rr, err := c.ReleaseOrder(ctx, "phone", "o-1")
	if err != nil || rr.Released || len(rr.Lines) != 3 {
		t.Fatalf("second release: %+v, %v", rr, err)
	}
	// Released, the ID still replays (released).
	if again, err := c.AllocateOrder(ctx, "o-1", lines); err != nil || !again.Replayed || !again.Released {
		t.Fatalf("allocate after release: %+v, %v", again, err)
	}
	// The returned stock serves the order that was refused.
	if _, err := c.AllocateOrder(ctx, "o-2", []coordinator.Line{{SKU: "phone", Qty: 3}, {SKU: "case", Qty: 2}, {SKU: "cable", Qty: 1}}); err != nil {
		t.Fatal(err)
	}
	auditAll(t, c, skus...)
}

// Invalid orders are refused before anything is read: no lines, too many,
// a SKU twice, a bad quantity, an unknown SKU, more lines than one
// transaction of the server's --max-txn-ops holds.
func TestCartInvalid(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "a", coordinator.SKUConfig{Total: 10, Segments: 1})
	many := make([]coordinator.Line, 33)
	for i := range many {
		many[i] = coordinator.Line{SKU: string(rune('a'+i%26)) + string(rune('a'+i/26)), Qty: 1}
	}
	// 26 lines of SKUs with a per-user limit: 5 compares (and reads) a
	// line, 130 > 128.
	limited := make([]coordinator.Line, 26)
	for i := range limited {
		limited[i] = coordinator.Line{SKU: fmt.Sprintf("lim-%02d", i), Qty: 1}
		mustCreate(t, c, limited[i].SKU, coordinator.SKUConfig{Total: 10, Segments: 1, PerUserLimit: 5})
	}
	for _, tc := range []struct {
		name  string
		lines []coordinator.Line
		want  error
	}{
		{"no lines", nil, coordinator.ErrInvalidArgument},
		{"65 lines", make([]coordinator.Line, coordinator.MaxOrderLines+1), coordinator.ErrInvalidArgument},
		{"a SKU twice", []coordinator.Line{{SKU: "a", Qty: 1}, {SKU: "a", Qty: 2}}, coordinator.ErrInvalidArgument},
		{"qty 0", []coordinator.Line{{SKU: "a", Qty: 0}}, coordinator.ErrInvalidArgument},
		{"unknown SKU", []coordinator.Line{{SKU: "a", Qty: 1}, {SKU: "nope", Qty: 1}}, coordinator.ErrUnknownSKU},
		{"33 lines over max-txn-ops 128", many, coordinator.ErrInvalidArgument},
		{"26 limited lines over max-txn-ops 128", limited, coordinator.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.AllocateOrder(ctx, "o", tc.lines, coordinator.WithBuyer("b")); !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
}

// A reserved order of several lines moves as one: ConfirmOrder confirms
// every line (a repeat replays), CancelOrder returns every line, and an
// order left unconfirmed is expired by the rebalancer's sweep, every line
// at one revision, its stock back; Confirm of any line after that is
// ErrExpired. Per-user limits hold per line.
func TestCartReservations(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "shoe", coordinator.SKUConfig{Total: 20, Segments: 2, InitialFill: 10})
	mustCreate(t, c, "sock", coordinator.SKUConfig{Total: 20, Segments: 2, InitialFill: 10, PerUserLimit: 3})
	lines := []coordinator.Line{{SKU: "shoe", Qty: 2}, {SKU: "sock", Qty: 3}}
	buyer := coordinator.WithBuyer("ann")

	if _, err := c.ReserveOrder(ctx, "r-0", lines, time.Hour); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Fatalf("reserve without a buyer on a limited SKU: %v", err)
	}
	a, err := c.ReserveOrder(ctx, "r-1", lines, time.Hour, buyer)
	if err != nil || a.State != segments.StateReserved || a.Deadline.IsZero() {
		t.Fatalf("reserve: %+v, %v", a, err)
	}
	// The buyer holds 3 socks: one more is over the limit, named by line.
	_, err = c.AllocateOrder(ctx, "r-2", []coordinator.Line{{SKU: "shoe", Qty: 1}, {SKU: "sock", Qty: 1}}, buyer)
	var le *coordinator.LineError
	if !errors.As(err, &le) || le.SKU != "sock" || !errors.Is(err, coordinator.ErrLimitExceeded) {
		t.Fatalf("over the limit: %v", err)
	}
	// A retry of the applied order with a line over the limit by itself
	// is a conflict (the order ID was used), not a refusal; a new order
	// with that line is refused by the limit, naming the line.
	if _, err := c.ReserveOrder(ctx, "r-1", []coordinator.Line{{SKU: "shoe", Qty: 2}, {SKU: "sock", Qty: 4}}, time.Hour, buyer); !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("retry with 4 socks: %v, want ErrConflict", err)
	}
	_, err = c.ReserveOrder(ctx, "r-9", []coordinator.Line{{SKU: "shoe", Qty: 1}, {SKU: "sock", Qty: 4}}, time.Hour, coordinator.WithBuyer("bob"))
	if !errors.As(err, &le) || le.Index != 1 || !errors.Is(err, coordinator.ErrLimitExceeded) {
		t.Fatalf("4 socks for a new buyer: %v", err)
	}
	cf, err := c.ConfirmOrder(ctx, "sock", "r-1")
	if err != nil || cf.Replayed || len(cf.Lines) != 2 {
		t.Fatalf("confirm: %+v, %v", cf, err)
	}
	if again, err := c.Confirm(ctx, "shoe", "r-1"); err != nil || !again.Replayed || again.Revision != cf.Revision {
		t.Fatalf("confirm of the other line: %+v, %v", again, err)
	}
	for _, s := range []string{"shoe", "sock"} {
		if o, _, _ := readRecord(t, c, s, "r-1"); o.State != segments.StateConfirmed {
			t.Fatalf("%s: %+v", s, o)
		}
		if rep := mustAudit(t, c, s); rep.Confirmed == 0 || rep.Reserved != 0 {
			t.Fatalf("%s after confirm: %+v", s, rep)
		}
	}
	if _, err := c.CancelOrder(ctx, "shoe", "r-1"); !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("cancel of a confirmed order: %v", err)
	}
	if r, err := c.ReleaseOrder(ctx, "shoe", "r-1"); err != nil || !r.Released {
		t.Fatalf("release: %+v, %v", r, err)
	}

	// Cancel returns every line (and the buyer's count).
	if _, err := c.ReserveOrder(ctx, "r-3", lines, time.Hour, buyer); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Cancel(ctx, "shoe", "r-3"); err != nil || !r.Released {
		t.Fatalf("cancel of one line: %+v, %v", r, err)
	}
	if got := auditAll(t, c, "shoe", "sock"); got["shoe"] != 0 || got["sock"] != 0 {
		t.Fatalf("after cancel: %v", got)
	}

	// Expiry by the sweep: every line together.
	x, err := c.ReserveOrder(ctx, "r-4", lines, time.Millisecond, buyer)
	if err != nil {
		t.Fatal(err)
	}
	startRebalancer(t, c)
	etcdtest.WaitFor(t, "the sweep expires the order", etcdtest.MinWait, func() bool {
		o, _, _ := readRecord(t, c, "sock", "r-4")
		return o.State == segments.StateExpired
	})
	_, shoeRev, _ := readRecord(t, c, "shoe", "r-4")
	o, sockRev, _ := readRecord(t, c, "sock", "r-4")
	if so, _, _ := readRecord(t, c, "shoe", "r-4"); so.State != segments.StateExpired || shoeRev != sockRev {
		t.Fatalf("lines expired apart: shoe %+v at %d, sock %+v at %d", so, shoeRev, o, sockRev)
	}
	if _, err := c.Confirm(ctx, "shoe", "r-4"); !errors.Is(err, coordinator.ErrExpired) {
		t.Fatalf("confirm after expiry: %v", err)
	}
	if got := auditAll(t, c, "shoe", "sock"); got["shoe"] != 0 || got["sock"] != 0 {
		t.Fatalf("after expiry: %v (reserved at %d)", got, x.Revision)
	}
	// The buyer's count went back too: 3 socks may be reserved again.
	if _, err := c.ReserveOrder(ctx, "r-5", lines, time.Hour, buyer); err != nil {
		t.Fatal(err)
	}
}

// An order whose stock sits only in a segment another process holds is
// served through that segment's lock (the held path), fenced by it, and
// the holder's own orders go on selling correctly after it.
func TestCartThroughHeldSegment(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	a, b := cs[0], cs[1]
	ctx := t.Context()
	mustCreate(t, a, "hot", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
	mustCreate(t, a, "cold", coordinator.SKUConfig{Total: 10, Segments: 1})
	noop := func(context.Context) error { return nil }
	if _, err := b.AllocateFunc(ctx, "hot", "b-1", 1, "", noop); err != nil {
		t.Fatal(err)
	}
	if len(engines.Of(b).Stock.HeldSegments("hot")) == 0 {
		t.Fatal("B holds no segment of hot after a step: the test would not reach the held path")
	}
	if _, err := a.AllocateOrder(ctx, "c-1", []coordinator.Line{{SKU: "hot", Qty: 8}, {SKU: "cold", Qty: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AllocateFunc(ctx, "hot", "b-2", 1, "", noop); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Allocate(ctx, "hot", "b-3", 1, ""); !errors.Is(err, coordinator.ErrInsufficientStock) {
		t.Fatalf("an 11th unit: %v", err)
	}
	if got := auditAll(t, a, "hot", "cold"); got["hot"] != 10 || got["cold"] != 2 {
		t.Fatalf("allocated: %v", got)
	}
}

// Prune works SKU by SKU: once one line of an order of several is archived,
// the order can no longer move whole, and says so (ErrOrderPruned) to a
// retry, a release or a confirm through any line, changing nothing; the
// books of both SKUs (one with the line in its archive) balance.
func TestCartLinePruned(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, c, "a", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
	mustCreate(t, c, "b", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
	lines := []coordinator.Line{{SKU: "a", Qty: 2}, {SKU: "b", Qty: 3}}
	if _, err := c.AllocateOrder(ctx, "p-1", lines); err != nil {
		t.Fatal(err)
	}
	if p, err := c.Prune(ctx, "a", time.Now().Add(time.Minute)); err != nil || p.Orders != 1 {
		t.Fatalf("prune a: %+v, %v", p, err)
	}
	before := stateKeys(t, raw)
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"retry", func() error { _, err := c.AllocateOrder(ctx, "p-1", lines); return err }},
		{"release through the kept line", func() error { _, err := c.Release(ctx, "b", "p-1"); return err }},
		{"release the order", func() error { _, err := c.ReleaseOrder(ctx, "b", "p-1"); return err }},
		{"confirm", func() error { _, err := c.ConfirmOrder(ctx, "b", "p-1"); return err }},
	} {
		if err := tc.call(); !errors.Is(err, coordinator.ErrOrderPruned) {
			t.Errorf("%s: %v, want ErrOrderPruned", tc.name, err)
		}
	}
	sameKeys(t, "calls on a partly pruned order", before, stateKeys(t, raw))
	if got := auditAll(t, c, "a", "b"); got["a"] != 0 || got["b"] != 3 {
		t.Fatalf("allocated: %v (a's line is in its archive)", got)
	}
}

// Each line of an order of several lines counts as an allocation of its
// SKU in stockctl_allocations_total; a refusal counts once, for the
// refused line's SKU; a replay once per line.
func TestCartMetrics(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	reg := prometheus.NewRegistry()
	c, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()
	mustCreate(t, c, "x", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
	mustCreate(t, c, "y", coordinator.SKUConfig{Total: 1, Segments: 1, InitialFill: 1})
	lines := []coordinator.Line{{SKU: "x", Qty: 1}, {SKU: "y", Qty: 1}}
	for _, order := range []string{"m-1", "m-1", "m-2"} {
		_, _ = c.AllocateOrder(ctx, order, lines)
	}
	g := gather(t, reg)
	for _, tc := range []struct {
		outcome string
		want    float64
	}{{"served", 2}, {"replayed", 2}, {"insufficient", 1}} {
		if got := g.sum("stockctl_allocations_total", map[string]string{"op": "allocate", "outcome": tc.outcome}); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.outcome, got, tc.want)
		}
	}
}

// The documented bound: an order of MaxOrderLines lines is one transaction
// on an etcd whose --max-txn-ops allows it (here 512, with
// WithMaxTxnOps), every line at one revision; released whole; each SKU's
// books balance. With the 65th line it is refused before anything is read.
func TestCartOfMaxLines(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithMaxTxnOps(512))
	c := newCoordinators(t, etcd, 1, coordinator.WithMaxTxnOps(512))[0]
	ctx := t.Context()
	var lines []coordinator.Line
	for i := range coordinator.MaxOrderLines {
		sku := fmt.Sprintf("sku-%02d", i)
		mustCreate(t, c, sku, coordinator.SKUConfig{Total: 5, Segments: 2, InitialFill: 2})
		lines = append(lines, coordinator.Line{SKU: sku, Qty: int64(1 + i%5)})
	}
	a, err := c.AllocateOrder(ctx, "big", lines)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range a.Lines {
		if l.Revision != a.Revision || l.Qty != lines[i].Qty {
			t.Fatalf("line %d: %+v at %d", i, l, a.Revision)
		}
		if rep := mustAudit(t, c, l.SKU); rep.Allocated != l.Qty {
			t.Fatalf("%s allocated %d, want %d", l.SKU, rep.Allocated, l.Qty)
		}
	}
	if r, err := c.ReleaseOrder(ctx, "sku-07", "big"); err != nil || len(r.Lines) != coordinator.MaxOrderLines {
		t.Fatalf("release: %+v, %v", r, err)
	}
	for _, l := range lines {
		if rep := mustAudit(t, c, l.SKU); rep.Allocated != 0 {
			t.Fatalf("%s allocated %d after the release", l.SKU, rep.Allocated)
		}
	}
	more := append(lines, coordinator.Line{SKU: "sku-extra", Qty: 1})
	if _, err := c.AllocateOrder(ctx, "bigger", more); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Fatalf("65 lines: %v", err)
	}
}
