package sale

import (
	"math"
	"slices"
	"time"
)

// result gathers the buyers' results into the run's.
func (r *run) result(buyers []buyerResult, elapsed time.Duration) *Result {
	res := &Result{
		Orders:     r.orders.Load(),
		Units:      r.units.Load(),
		Refusals:   r.refusals.Load(),
		Errors:     r.errs.Load(),
		Replayed:   r.replayed.Load(),
		Unresolved: r.unresolved.Load(),
		Elapsed:    elapsed,
		SoldOut:    true,
	}
	r.mu.Lock()
	res.FirstError = r.firstErr
	r.mu.Unlock()

	var n int
	for _, b := range buyers {
		n += len(b.latencies)
	}
	res.Latencies = make([]time.Duration, 0, n)
	res.MinPerBuyer = math.MaxInt64
	for _, b := range buyers {
		res.Latencies = append(res.Latencies, b.latencies...)
		res.MinPerBuyer = min(res.MinPerBuyer, b.orders)
		res.MaxPerBuyer = max(res.MaxPerBuyer, b.orders)
		res.SoldOut = res.SoldOut && b.soldOut
	}
	if len(buyers) == 0 {
		res.MinPerBuyer = 0
	}
	slices.Sort(res.Latencies)
	res.P50 = Percentile(res.Latencies, 50)
	res.P90 = Percentile(res.Latencies, 90)
	res.P99 = Percentile(res.Latencies, 99)
	if len(res.Latencies) > 0 {
		res.Max = res.Latencies[len(res.Latencies)-1]
	}
	res.Selling = time.Duration(r.lastServed.Load())
	if s := res.Selling.Seconds(); s > 0 {
		res.OrdersPerSec = float64(res.Orders) / s
		res.UnitsPerSec = float64(res.Units) / s
	}
	switch {
	case res.SoldOut:
		res.Stop = StopSoldOut
	case r.stopped():
		res.Stop = r.stopWhy
	default:
		// Every buyer returned without a stop: only the run's ctx ending
		// does that (its AfterFunc may not have run yet).
		res.Stop = StopCancelled
	}
	return res
}

// Percentile returns the p-th percentile (0 < p ≤ 100) of sorted samples by
// the nearest-rank method: the smallest sample such that at least p% of the
// samples are less than or equal to it. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted)) / 100))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}
