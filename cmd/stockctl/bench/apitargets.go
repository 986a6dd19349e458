package bench

import "fmt"

// The API's targets (issue 29, with OrderStream): pure allocation through
// `stockctl serve` processes makes at least targetAPIRatio of the
// in-process rate at the same shape in the same run, and adds at most
// targetAPIP99Ms to the p99 latency at targetAPIBuyers buyers.
const (
	targetAPIRatio  = 0.8
	targetAPIP99Ms  = 5
	targetAPIBuyers = 200
)

// apiTargets compares each stockctl-api row with the stockctl-nostep row
// of its shape, in run order: the rate's ratio at every shape, and the p99
// difference too at 200 buyers. Shapes without both rows are skipped.
func apiTargets(rows []Row) []Target {
	var ts []Target
	for i := range rows {
		api := &rows[i]
		if api.Strategy != NameStockctlAPI {
			continue
		}
		var in *Row
		for j := range rows {
			if r := &rows[j]; r.Strategy == nameNoStep && r.Segments == api.Segments && r.Buyers == api.Buyers {
				in = r
			}
		}
		if in == nil {
			continue
		}
		rate, dp99 := ratio(api.OrdersPerSec, in.OrdersPerSec), api.LatencyMs.P99-in.LatencyMs.P99
		t := Target{Name: fmt.Sprintf("pure allocation through the API (%s vs %s), %s: ≥ %.1f× the rate", NameStockctlAPI, nameNoStep, shapeText(api), targetAPIRatio),
			Detail: fmt.Sprintf("%s vs %s allocations/s (%.2f×); p99 %.1f vs %.1f ms (%+.1f ms); CPU %.0f vs %.0f µs an order",
				thousands(api.OrdersPerSec), thousands(in.OrdersPerSec), rate, api.LatencyMs.P99, in.LatencyMs.P99, dp99,
				api.CPUMicrosPerOrder, in.CPUMicrosPerOrder)}
		met := rate >= targetAPIRatio
		if api.Buyers == targetAPIBuyers {
			t.Name += fmt.Sprintf(", p99 ≤ +%d ms", targetAPIP99Ms)
			met = met && dp99 <= targetAPIP99Ms
		}
		t.Status = status(met)
		ts = append(ts, t)
	}
	return ts
}
