package cli

import (
	"strings"
	"testing"
)

var smallDemo = []string{"demo", "--total", "400", "--segments", "4", "--initial-fill", "40", "--low-watermark", "5",
	"--refill-batch", "10", "--coordinators", "2", "--buyers", "16", "--step", "2ms", "--seed", "1", "--attempt-timeout", "30s"}

// The demo on its own embedded etcd (no --endpoints): sells out exactly,
// and its JSON summary says so.
func TestDemoJSON(t *testing.T) {
	t.Parallel()
	r := run(t, append([]string{"-o", "json"}, smallDemo...)...)
	if r.code != 0 {
		t.Fatalf("demo: exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	checkShape(t, "demo", r.stdout, "config", "stop", "soldOut", "orders", "units", "refusals", "errors", "unresolved", "gathered",
		"sellingSeconds", "elapsedSeconds", "ordersPerSec", "latencyMs", "ordersPerBuyer", "oversold", "unsold", "audit",
		"rebalancer", "pool", "segments", "ok", "failures")
	var d demoReport
	decode(t, r.stdout, &d)
	if !d.OK || !d.SoldOut || d.Stop != "sold out" || d.Units != 400 || d.Oversold != 0 || d.Unsold != 0 || len(d.Failures) != 0 {
		t.Fatalf("demo: %+v", d)
	}
	if !d.Audit.OK || d.Audit.Allocated != d.Units || d.Audit.Orders != d.Orders || d.Audit.Pool != 0 || d.Audit.Segments != 0 {
		t.Fatalf("demo audit: %+v (units %d, orders %d)", d.Audit, d.Units, d.Orders)
	}
	if d.Rebalancer.Refills == 0 || d.Rebalancer.Refilled+d.Config.InitialFill-d.Rebalancer.Drained > 400+d.Rebalancer.Drained {
		t.Fatalf("demo rebalancer: %+v", d.Rebalancer)
	}
	var served, refilled int64
	for _, s := range d.Segments {
		served += s.Orders
		refilled += s.Refilled
	}
	if served < d.Orders-d.Pool.Orders || refilled != d.Rebalancer.Refilled || len(d.Segments) != 4 {
		t.Fatalf("segment rows %+v do not add up (orders %d)", d.Segments, d.Orders)
	}
	if !(0 < d.LatencyMs.P50 && d.LatencyMs.P50 <= d.LatencyMs.P99 && d.LatencyMs.P99 <= d.LatencyMs.Max) || d.OrdersPerSec <= 0 {
		t.Fatalf("demo figures: %+v", d)
	}
	if strings.Contains(r.stderr, "selling:") {
		t.Fatalf("progress line on a non-terminal stderr: %q", r.stderr)
	}
}

// The demo against a given etcd, in table form, with the progress line
// forced on (stderr only).
func TestDemoTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run(append(smallDemo, "--progress", "always")...)
	if r.code != 0 {
		t.Fatalf("demo: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, want := range []string{"flash sale of flash-sale-", "RESULT      sold out: every check passed", "UNITS SOLD  400 of 400",
		"OVERSOLD    0", "AUDIT       ok: total 400 = pool 0 + segments 0 + allocated 400",
		"SEGMENT  REMAINING  ORDERS  REFILLS  REFILLED  DRAINS  DRAINED  ORDERS SERVED"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo table lacks %q:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "\rselling: ") || strings.Contains(r.stdout, "selling:") {
		t.Errorf("progress line: stderr %q", r.stderr)
	}
}

// The checkout demo: every order a reservation, 30% never paid, a per-user
// limit. It sells out exactly: the abandoned carts all expired and their
// units were sold again; no user holds more than the limit; the books
// balance.
func TestDemoCheckout(t *testing.T) {
	t.Parallel()
	r := run(t, append([]string{"-o", "json"}, append(smallDemo, "--checkout", "--reserve-ttl", "300ms")...)...)
	if r.code != 0 {
		t.Fatalf("demo: exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	var d demoReport
	decode(t, r.stdout, &d)
	co := d.Checkout
	if !d.OK || !d.SoldOut || d.Units != 400 || d.Oversold != 0 || d.Unsold != 0 || co == nil {
		t.Fatalf("demo: %+v", d)
	}
	if co.Abandoned == 0 || co.Expired != co.Abandoned || co.ExpiredUnits != co.AbandonedUnits ||
		co.PerUserLimit != 4 || co.MaxPerBuyer > 4 || co.Buyers == 0 {
		t.Fatalf("checkout figures: %+v", *co)
	}
	if !d.Audit.OK || d.Audit.Allocated != 400 || d.Audit.Reserved != 0 || d.Audit.ExpiredOrders != co.Expired {
		t.Fatalf("demo audit: %+v", d.Audit)
	}
}
