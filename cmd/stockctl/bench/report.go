package bench

import (
	"fmt"
	"time"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
)

// Row is one strategy's run at one shape (part of stockctl bench's -o json
// contract).
type Row struct {
	Strategy string `json:"strategy"`
	Title    string `json:"title"`
	Segments int    `json:"segments"`
	// Places is how many locks (or keys) orders were served from: the
	// segment count, or 1 for a one-key strategy.
	Places int `json:"places"`
	Buyers int `json:"buyers"`
	// StepMs is the business step each order ran holding its lock; 0 for
	// pure allocation.
	StepMs float64 `json:"stepMs"`
	// Stop says why the run ended: "max duration" or "max orders" when it
	// went as planned.
	Stop   string `json:"stop"`
	Orders int64  `json:"orders"`
	// Seconds runs from the start to the last served order; OrdersPerSec
	// is over it.
	Seconds      float64 `json:"seconds"`
	OrdersPerSec float64 `json:"ordersPerSec"`
	// IdealPerSec is places ÷ step, and OfIdeal the share of it reached;
	// both 0 for pure allocation, which has no ideal.
	IdealPerSec float64 `json:"idealPerSec"`
	OfIdeal     float64 `json:"ofIdeal"`
	// LatencyMs is end to end, from an order's first attempt to its
	// success, queueing included. ServiceMs runs from the moment the order
	// held its lock (its step began) to its return: the lock's own cost.
	// ServiceMs is zero for pure allocation.
	LatencyMs Latency `json:"latencyMs"`
	// CPUMicrosPerOrder is the CPU time the run used per order served, in
	// µs: the bench's process (buyers, in-process coordinators, the
	// embedded etcd) and the strategy's own processes (stockctl-api's
	// serve processes). 0 where it cannot be read (not Linux).
	CPUMicrosPerOrder float64 `json:"cpuUsPerOrder"`
	ServiceMs         Latency `json:"serviceMs"`
	// OrdersPerBuyer is the fewest and most orders one buyer was served.
	OrdersPerBuyer MinMax `json:"ordersPerBuyer"`
	// Refills counts the waits for stock seen during the run by a
	// RefillObserver: a segment's stock (counter + inbox) fell below its
	// low watermark, and its inbox rose afterwards (a rebalancer refill or
	// a seller's pull from the pool: stock arriving, whoever moved it).
	// RefillMs is from the one to the other, RefillsPending the segments
	// still waiting when the sale ended. All three are null for strategies
	// without a pool (every one but stockctl's); RefillMs is also null
	// when no refill was seen.
	Refills        *int64   `json:"refills"`
	RefillMs       *Latency `json:"refillMs"`
	RefillsPending *int64   `json:"refillsPending"`
	Errors         int64    `json:"errors"`
	FirstError     string   `json:"firstError,omitempty"`
	// Unresolved orders were cut off (every attempt failed, or the run's
	// end); they may or may not have taken stock.
	Unresolved int64 `json:"unresolved"`
	// Oversold is units sold beyond the stock, by the strategy's books
	// read after the run (must be 0).
	Oversold int64 `json:"oversold"`
	Books    Books `json:"books"`
	// OK is true when the books balance, nothing was oversold, the
	// buyers' count of units agrees with the books, and the run ended as
	// planned; Problems says what did not.
	OK       bool     `json:"ok"`
	Problems []string `json:"problems"`
}

// Latency is a distribution's p50, p99 and max, in milliseconds.
type Latency struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// MinMax is a range.
type MinMax struct {
	Min int64 `json:"min"`
	Max int64 `json:"max"`
}

func latencyOf(sorted []time.Duration) Latency {
	if len(sorted) == 0 {
		return Latency{}
	}
	return Latency{P50: ms(sale.Percentile(sorted, 50)), P99: ms(sale.Percentile(sorted, 99)), Max: ms(sorted[len(sorted)-1])}
}

// fill copies a run's figures into the row.
func (r *Row) fill(res *sale.Result, service []time.Duration) {
	r.Stop = string(res.Stop)
	r.Orders = res.Orders
	r.Seconds = res.Selling.Seconds()
	r.OrdersPerSec = res.OrdersPerSec
	if r.IdealPerSec > 0 {
		r.OfIdeal = r.OrdersPerSec / r.IdealPerSec
	}
	r.LatencyMs = latencyOf(res.Latencies)
	r.ServiceMs = latencyOf(service)
	r.OrdersPerBuyer = MinMax{Min: res.MinPerBuyer, Max: res.MaxPerBuyer}
	r.Errors = res.Errors
	if res.FirstError != nil {
		r.FirstError = res.FirstError.Error()
	}
	r.Unresolved = res.Unresolved
}

// refills copies what a refill observer saw into the row; an observer
// that failed is a problem of the run (its figures are cut short).
func (r *Row) refills(rr RefillResult) {
	n, pending := int64(len(rr.Latencies)), int64(rr.Pending)
	r.Refills, r.RefillsPending = &n, &pending
	if n > 0 {
		l := latencyOf(rr.Latencies)
		r.RefillMs = &l
	}
	if rr.Err != nil {
		r.Problems = append(r.Problems, "refill observer: "+rr.Err.Error())
		r.OK = false
	}
}

// check compares the buyers' count with the strategy's books.
func (r *Row) check(res *sale.Result, b Books) {
	r.Books = b
	if r.Books.Problems == nil {
		r.Books.Problems = []string{}
	}
	r.Oversold = b.Oversold()
	bad := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }
	if r.Oversold != 0 {
		bad("oversold %d units: %d sold + %d remaining of %d stock (%d below zero)", r.Oversold, b.Sold, b.Remaining, b.Stock, b.Negative)
	}
	if b.Sold+b.Remaining != b.Stock && r.Oversold == 0 {
		bad("the books do not balance: %d sold + %d remaining ≠ %d stock", b.Sold, b.Remaining, b.Stock)
	}
	for _, p := range b.Problems {
		bad("audit: %s", p)
	}
	// Every served order is in the books; an unresolved one may be.
	if b.Sold < res.Units || b.Sold > res.Units+res.Unresolved {
		bad("the books hold %d units in orders, the buyers were served %d (%d orders unresolved)", b.Sold, res.Units, res.Unresolved)
	}
	switch res.Stop {
	case sale.StopMaxDuration, sale.StopMaxOrders:
	default:
		bad("the run ended on %s", res.Stop)
	}
	r.OK = len(r.Problems) == 0
}
