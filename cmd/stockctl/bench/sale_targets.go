package bench

import (
	"fmt"
	"strings"
)

// The sale-scale targets (a real sale: many SKUs, sold out in seconds, and
// the storm of orders after), judged on a sale run's rows.
const (
	targetRefusalsPerSec = 50_000
	targetRefusalP99Ms   = 10
	targetManySKURatio   = 0.8
)

// SaleTargets judges the rows of bench --sale:
//
//   - refusals/s on a sold-out SKU (the storm shape) is at least 50,000
//     and at least redis-lua's in the same run;
//   - refusal p99 is at most 10 ms in the storm, zero and storm-release
//     shapes (the worst counts);
//   - no sampled refusal is untrue in the storm-release shape;
//   - no order fails with anything but a refusal, in any stockctl row;
//   - orders/s over many SKUs (uniform and skewed) ÷ orders/s on one SKU
//     is at least 0.8.
//
// Targets whose rows did not run are left out.
func SaleTargets(rows []SaleRow) []Target {
	find := func(strategy, shape string) *SaleRow {
		for i := range rows {
			if rows[i].Strategy == strategy && rows[i].Shape.Name == shape {
				return &rows[i]
			}
		}
		return nil
	}
	var out []Target
	judge := func(name string, met bool, detail string) {
		status := TargetNotMet
		if met {
			status = TargetMet
		}
		out = append(out, Target{Name: name, Status: status, Detail: detail})
	}
	if st := find(nameStockctl, "storm"); st != nil {
		detail := fmt.Sprintf("stockctl %.0f/s", st.RefusalsPerSec)
		met := st.RefusalsPerSec >= targetRefusalsPerSec
		if lua := find(nameRedisLua, "storm"); lua != nil {
			detail += fmt.Sprintf(", redis-lua %.0f/s (%.2fx)", lua.RefusalsPerSec, st.RefusalsPerSec/lua.RefusalsPerSec)
			met = met && st.RefusalsPerSec >= lua.RefusalsPerSec
		}
		judge(fmt.Sprintf("refusals/s on a sold-out SKU >= %d and >= redis-lua's", targetRefusalsPerSec), met, detail)
	}
	var p99s []string
	worst := -1.0
	for _, shape := range []string{"storm", "zero", "storm-release"} {
		if r := find(nameStockctl, shape); r != nil && r.Refusals > 0 {
			p99s = append(p99s, fmt.Sprintf("%s %.1f ms", shape, r.RefusalMs.P99))
			worst = max(worst, r.RefusalMs.P99)
		}
	}
	if worst >= 0 {
		judge(fmt.Sprintf("refusal p99 <= %d ms", targetRefusalP99Ms), worst <= targetRefusalP99Ms, strings.Join(p99s, ", "))
	}
	if r := find(nameStockctl, "storm-release"); r != nil && r.TruthChecked > 0 {
		judge("no untrue refusal with releases racing the storm", r.Untrue == 0,
			fmt.Sprintf("%d of %d sampled refusals untrue, %d releases", r.Untrue, r.TruthChecked, r.Releases))
	}
	var errs, unresolved int64
	ran := false
	for _, r := range rows {
		if r.Strategy == nameStockctl {
			errs, unresolved, ran = errs+r.Errors, unresolved+r.Unresolved, true
		}
	}
	if ran {
		judge("no order fails with anything but a refusal", errs == 0 && unresolved == 0,
			fmt.Sprintf("%d failed attempts, %d orders unresolved", errs, unresolved))
	}
	if one := find(nameStockctl, "one"); one != nil && one.OrdersPerSec > 0 {
		for _, shape := range []string{"many", "many-skewed"} {
			if m := find(nameStockctl, shape); m != nil {
				ratio := m.OrdersPerSec / one.OrdersPerSec
				judge(fmt.Sprintf("orders/s over %d SKUs (%s) / one SKU >= %.1f", m.Shape.SKUs, shape, targetManySKURatio),
					ratio >= targetManySKURatio, fmt.Sprintf("%.0f/s / %.0f/s = %.2f", m.OrdersPerSec, one.OrdersPerSec, ratio))
			}
		}
	}
	return out
}
