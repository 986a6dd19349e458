package cli

import (
	"fmt"
	"sync"
	"time"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
	"github.com/stockctl/stockctl/coordinator"
)

// demoTally counts what only the buyers see: per place, the orders served
// from it. The moves and the checkout figures come from the books in etcd
// (demo_books.go), whoever made them.
type demoTally struct {
	mu       sync.Mutex
	orders   []int64 // per segment
	pool     int64   // orders served (partly) from the pool
	gathered int64   // orders served from more than one place

	// Checkout mode (demo_checkout.go): the delays of the expiries this
	// demo's rebalancer made, and the per-user-limit refusals.
	expiryDelays  []time.Duration
	limitRefusals int64
}

func newDemoTally(n int) *demoTally {
	return &demoTally{orders: make([]int64, n)}
}

func (t *demoTally) order(a *coordinator.Allocation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(a.Parts) > 1 {
		t.gathered++
	}
	for _, p := range a.Parts {
		switch i := p.Place.Index(); {
		case p.Place.IsPool():
			t.pool++
		case i < len(t.orders):
			t.orders[i]++
		}
	}
}

// demoReport is the demo's result (its -o json shape).
type demoReport struct {
	Config demoConfig `json:"config"`
	// Stop says why the sale ended: "sold out" unless a bound or an
	// interrupt cut it short.
	Stop    string `json:"stop"`
	SoldOut bool   `json:"soldOut"`
	// Orders served and the units they took; refusals are insufficient-
	// stock answers (every buyer gets at least one: that is how it learns
	// the sale is over).
	Orders     int64  `json:"orders"`
	Units      int64  `json:"units"`
	Refusals   int64  `json:"refusals"`
	Errors     int64  `json:"errors"`
	FirstError string `json:"firstError,omitempty"`
	Unresolved int64  `json:"unresolved"`
	// Gathered counts orders served from several places at once.
	Gathered int64 `json:"gathered"`
	// SellingSeconds runs to the last served order, ElapsedSeconds until
	// every buyer had been told the sale is over; OrdersPerSec is over the
	// selling time.
	SellingSeconds float64      `json:"sellingSeconds"`
	ElapsedSeconds float64      `json:"elapsedSeconds"`
	OrdersPerSec   float64      `json:"ordersPerSec"`
	LatencyMs      latencyView  `json:"latencyMs"`
	OrdersPerBuyer minMaxView   `json:"ordersPerBuyer"`
	Oversold       int64        `json:"oversold"` // units sold beyond the total
	Unsold         int64        `json:"unsold"`   // units of the total not sold
	Audit          auditView    `json:"audit"`
	Rebalancer     movesView    `json:"rebalancer"`
	Pool           poolRowView  `json:"pool"`
	Segments       []demoSegRow `json:"segments"`
	// Checkout is the checkout mode's figures (--checkout only).
	Checkout *checkoutView `json:"checkout,omitempty"`
	// OK is true when every check passed; Failures says which did not.
	OK       bool     `json:"ok"`
	Failures []string `json:"failures"`
}

type latencyView struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

type minMaxView struct {
	Min int64 `json:"min"`
	Max int64 `json:"max"`
}

// movesView is what moved between the pool and the segments during the
// sale, read from etcd's history: the elected rebalancer's refills and
// drains (Leader names it: this demo's, or another process's such as
// `stockctl serve`), and the selling processes' pulls from the pool.
type movesView struct {
	Leader   string `json:"leader"`
	Refills  int64  `json:"refills"`
	Refilled int64  `json:"refilled"`
	Drains   int64  `json:"drains"`
	Drained  int64  `json:"drained"`
	Pulls    int64  `json:"pulls"`
	Pulled   int64  `json:"pulled"`
}

type poolRowView struct {
	Remaining int64 `json:"remaining"`
	Orders    int64 `json:"orders"`
}

// demoSegRow is one segment after the sale: what is left, how many orders
// it served, and what moved into it (refills, the sellers' pulls) and out
// of it (drains).
type demoSegRow struct {
	Index     int   `json:"index"`
	Remaining int64 `json:"remaining"`
	Orders    int64 `json:"orders"`
	Refills   int64 `json:"refills"`
	Refilled  int64 `json:"refilled"`
	Drains    int64 `json:"drains"`
	Drained   int64 `json:"drained"`
	Pulls     int64 `json:"pulls"`
	Pulled    int64 `json:"pulled"`
}

func newDemoReport(d demoConfig, res *sale.Result, st *coordinator.Status, audit *coordinator.AuditReport, t *demoTally, mv *bookMoves, leader string) demoReport {
	r := demoReport{
		Config: d, Stop: string(res.Stop), SoldOut: res.SoldOut,
		Orders: res.Orders, Units: res.Units, Refusals: res.Refusals, Errors: res.Errors, Unresolved: res.Unresolved,
		SellingSeconds: res.Selling.Seconds(), ElapsedSeconds: res.Elapsed.Seconds(), OrdersPerSec: res.OrdersPerSec,
		LatencyMs:      latencyView{P50: ms(res.P50), P90: ms(res.P90), P99: ms(res.P99), Max: ms(res.Max)},
		OrdersPerBuyer: minMaxView{Min: res.MinPerBuyer, Max: res.MaxPerBuyer},
		// Honest figures: what the buyers were actually served, against
		// the SKU's total as etcd has it.
		Oversold:   max(0, res.Units-audit.Total),
		Unsold:     max(0, audit.Total-res.Units),
		Audit:      auditViewOf(audit),
		Pool:       poolRowView{Remaining: st.Pool},
		Rebalancer: movesView{Leader: leader},
		Failures:   []string{},
	}
	if res.FirstError != nil {
		r.FirstError = res.FirstError.Error()
	}
	t.mu.Lock()
	r.Gathered = t.gathered
	r.Pool.Orders = t.pool
	for i, s := range st.Segments {
		row := demoSegRow{Index: s.Index, Remaining: s.Remaining}
		if i < len(t.orders) {
			row.Orders = t.orders[i]
		}
		if i < len(mv.refills) {
			row.Refills, row.Refilled, row.Drains, row.Drained = mv.refills[i], mv.refilled[i], mv.drains[i], mv.drained[i]
			row.Pulls, row.Pulled = mv.pulls[i], mv.pulled[i]
		}
		r.Rebalancer.Refills += row.Refills
		r.Rebalancer.Refilled += row.Refilled
		r.Rebalancer.Drains += row.Drains
		r.Rebalancer.Drained += row.Drained
		r.Rebalancer.Pulls += row.Pulls
		r.Rebalancer.Pulled += row.Pulled
		r.Segments = append(r.Segments, row)
	}
	t.mu.Unlock()

	fail := func(format string, args ...any) { r.Failures = append(r.Failures, fmt.Sprintf(format, args...)) }
	if r.Oversold != 0 {
		fail("oversold %d units: the buyers were served %d units of a total of %d", r.Oversold, res.Units, audit.Total)
	}
	if !audit.OK {
		fail("the audit failed: %v", audit.Problems)
	}
	if audit.Allocated != res.Units {
		fail("the audit counts %d units in active orders, the buyers were served %d (%d orders unresolved)",
			audit.Allocated, res.Units, res.Unresolved)
	}
	if r.Unsold != 0 {
		fail("the sale stopped (%s) with %d units unsold", res.Stop, r.Unsold)
	}
	if res.Unresolved != 0 {
		// Every attempt at them failed: whether they took stock is not
		// known to the buyers, whatever the books say.
		fail("%d orders unresolved (every attempt failed; first error: %v)", res.Unresolved, res.FirstError)
	}
	r.OK = len(r.Failures) == 0
	return r
}

func (r demoReport) table() table {
	var t table
	var result string
	switch {
	case r.OK && r.SoldOut:
		result = "sold out: every check passed"
	case r.OK:
		result = fmt.Sprintf("every unit sold, every check passed (the sale ended on %s)", r.Stop)
	default:
		result = fmt.Sprintf("FAILED (the sale ended on %s): see below", r.Stop)
	}
	t.add("RESULT", result)
	t.add("ORDERS", fmt.Sprintf("%d served (%d from several places at once)", r.Orders, r.Gathered))
	t.add("REFUSALS", fmt.Sprintf("%d (insufficient stock: how each buyer learns the sale is over)", r.Refusals))
	errs := fmt.Sprint(r.Errors)
	if r.FirstError != "" {
		errs = fmt.Sprintf("%d failed attempts, each retried under its order ID (first: %s)", r.Errors, r.FirstError)
	}
	if r.Unresolved > 0 {
		errs += fmt.Sprintf("; %d orders unresolved", r.Unresolved)
	}
	t.add("ERRORS", errs)
	t.add("UNITS SOLD", fmt.Sprintf("%d of %d", r.Units, r.Audit.Total))
	t.add("THROUGHPUT", fmt.Sprintf("%.0f orders/s (%d orders in %s; every buyer told it is over after %s)",
		r.OrdersPerSec, r.Orders, seconds(r.SellingSeconds), seconds(r.ElapsedSeconds)))
	t.add("LATENCY", fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s",
		msText(r.LatencyMs.P50), msText(r.LatencyMs.P90), msText(r.LatencyMs.P99), msText(r.LatencyMs.Max)))
	t.add("PER BUYER", fmt.Sprintf("%d to %d orders", r.OrdersPerBuyer.Min, r.OrdersPerBuyer.Max))
	t.add("OVERSOLD", r.Oversold)
	a := r.Audit
	verdict := "ok"
	if !a.OK {
		verdict = "FAILED"
	}
	t.add("AUDIT", fmt.Sprintf("%s: total %d = pool %d + segments %d + allocated %d (%d orders, revision %d)",
		verdict, a.Total, a.Pool, a.Segments, a.Allocated, a.Orders, a.Revision))
	leader := r.Rebalancer.Leader
	if leader == "" {
		leader = "no rebalancer elected"
	}
	t.add("REBALANCER", fmt.Sprintf("%s: %d refills (%d units), %d drains (%d units)",
		leader, r.Rebalancer.Refills, r.Rebalancer.Refilled, r.Rebalancer.Drains, r.Rebalancer.Drained))
	t.add("PULLS", fmt.Sprintf("%d (%d units): sellers that found their segments empty took stock from the pool themselves",
		r.Rebalancer.Pulls, r.Rebalancer.Pulled))
	if r.Checkout != nil {
		r.Checkout.rows(&t)
	}

	t.header = []string{"SEGMENT", "REMAINING", "ORDERS", "REFILLS", "REFILLED", "PULLS", "DRAINS", "DRAINED", "ORDERS SERVED"}
	var most int64
	for _, s := range r.Segments {
		most = max(most, s.Orders)
	}
	t.rows = append(t.rows, []string{"pool", fmt.Sprint(r.Pool.Remaining), fmt.Sprint(r.Pool.Orders), "", "", "", "", "", bar(r.Pool.Orders, most)})
	for _, s := range r.Segments {
		t.rows = append(t.rows, []string{fmt.Sprint(s.Index), fmt.Sprint(s.Remaining), fmt.Sprint(s.Orders),
			fmt.Sprint(s.Refills), fmt.Sprint(s.Refilled), fmt.Sprint(s.Pulls), fmt.Sprint(s.Drains), fmt.Sprint(s.Drained), bar(s.Orders, most)})
	}
	for _, f := range r.Failures {
		t.notes = append(t.notes, "FAILED: "+f)
	}
	return t
}

func msText(v float64) string {
	return (time.Duration(v * float64(time.Millisecond))).Round(100 * time.Microsecond).String()
}

func seconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(10 * time.Millisecond).String()
}
