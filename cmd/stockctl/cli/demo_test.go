package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
	"github.com/stockctl/stockctl/coordinator"
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
	// Every unit the segments sold came from the initial fill or a move
	// from the pool (a refill or a seller's pull), less what drains took back.
	rb := d.Rebalancer
	if rb.Leader != "demo-rebalancer" || rb.Refills+rb.Pulls == 0 ||
		d.Config.InitialFill+rb.Refilled+rb.Pulled-rb.Drained > 400 {
		t.Fatalf("demo moves: %+v", rb)
	}
	var served, refilled, pulled int64
	for _, s := range d.Segments {
		served += s.Orders
		refilled += s.Refilled
		pulled += s.Pulled
	}
	if served < d.Orders-d.Pool.Orders || refilled != rb.Refilled || pulled != rb.Pulled || len(d.Segments) != 4 {
		t.Fatalf("segment rows %+v do not add up (orders %d, moves %+v)", d.Segments, d.Orders, rb)
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
		"SEGMENT  REMAINING  ORDERS  REFILLS  REFILLED  PULLS  DRAINS  DRAINED  ORDERS SERVED", "rebalancer: the demo's own"} {
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
	if !d.OK || len(d.Failures) != 0 || co == nil {
		t.Fatalf("demo not ok: failures %q (checkout %+v)", d.Failures, co)
	}
	// Each check on its own, saying what mismatched. A payment late on a
	// slow machine makes one more expired reservation (and the order is
	// placed again): the figures come from the records, so they agree
	// whatever the machine's speed.
	for _, c := range []struct {
		what      string
		got, want int64
	}{
		{"units sold", d.Units, 400},
		{"oversold", d.Oversold, 0},
		{"unsold", d.Unsold, 0},
		{"unresolved orders", d.Unresolved, 0},
		{"expired reservations (records) vs abandoned carts + late payments", co.Expired, co.Abandoned + co.Late},
		{"expired reservations: records vs audit", co.Expired, d.Audit.ExpiredOrders},
		{"audit: allocated", d.Audit.Allocated, 400},
		{"audit: reserved", d.Audit.Reserved, 0},
		{"per-user limit", co.PerUserLimit, 4},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
		}
	}
	if !d.SoldOut || !d.Audit.OK || co.Abandoned == 0 || co.MaxPerBuyer > 4 || co.Buyers == 0 {
		t.Errorf("sold out %v, audit ok %v (problems %q), abandoned carts %d, most units a buyer holds %d, buyers %d",
			d.SoldOut, d.Audit.OK, d.Audit.Problems, co.Abandoned, co.MaxPerBuyer, co.Buyers)
	}
}

// A run with unresolved orders is not ok, whatever else balances: the
// buyers do not know whether those orders took stock.
func TestDemoReportUnresolvedIsNotOK(t *testing.T) {
	t.Parallel()
	d := demoConfig{Total: 10, Segments: 1}
	res := &sale.Result{Stop: sale.StopSoldOut, SoldOut: true, Orders: 10, Units: 10, Errors: 9, Unresolved: 3,
		FirstError: errors.New("attempt took too long")}
	st := &coordinator.Status{Segments: []coordinator.SegmentStatus{{}}}
	audit := &coordinator.AuditReport{OK: true, Total: 10, Allocated: 10, Orders: 10}
	r := newDemoReport(d, res, st, audit, newDemoTally(1), &bookMoves{refills: []int64{0}, refilled: []int64{0},
		pulls: []int64{0}, pulled: []int64{0}, drains: []int64{0}, drained: []int64{0}}, "")
	if r.OK || len(r.Failures) != 1 || !strings.Contains(r.Failures[0], "3 orders unresolved") {
		t.Fatalf("report of a run with 3 unresolved orders: ok %v, failures %q", r.OK, r.Failures)
	}
}

// The demo against `stockctl serve`'s etcd, whose rebalancer leads: the
// demo starts without waiting for its own to be elected, and reports the
// moves serve's rebalancer made, from etcd's history (it used to report
// its own rebalancer's moves: none).
func TestDemoAgainstServe(t *testing.T) {
	t.Parallel()
	srv := startServe(t, "served-demo")
	var d demoReport
	decode(t, srv.ok(t, append([]string{"-o", "json"}, smallDemo...)...), &d)
	if !d.OK || d.Rebalancer.Leader != "served-demo" || d.Rebalancer.Refills == 0 {
		t.Fatalf("demo against serve: ok %v, failures %q, moves %+v", d.OK, d.Failures, d.Rebalancer)
	}
	srv.stop(t)
}
