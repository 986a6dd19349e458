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
	// Issue 27's: one key per order.
	targetManySKURatioLarge = 0.7  // 10,000 SKUs ÷ one SKU
	targetKeysOneSKU        = 1.1  // etcd keys per served order, one SKU
	targetKeysManySKUs      = 1.3  // and over many SKUs
	targetComparesPerOrder  = 1.5  // the clients' compares per served order
	targetRefusedCommits    = 0.02 // commits refused by their compares
	targetOfRedisOne        = 0.8  // one SKU ÷ redis-lua's
	targetOfRedisMany       = 0.5  // 1,000 SKUs ÷ redis-lua's
	targetOfLimit           = 0.5  // one SKU ÷ the physical limit (limit-64)
)

// manySKUShapes are the sale shapes over many SKUs with plenty of stock,
// judged against "one".
var manySKUShapes = []string{"many", "many-skewed", "many-10k", "many-prepared", "many-10k-prepared"}

// SaleTargets judges the rows of bench --sale:
//
//   - refusals/s on a sold-out SKU (the storm shape) is at least 50,000
//     and at least redis-lua's in the same run;
//   - refusal p99 is at most 10 ms in the storm, zero and storm-release
//     shapes (the worst counts);
//   - no sampled refusal is untrue in the storm-release shape;
//   - no order fails with anything but a refusal, in any stockctl row;
//   - orders/s over many SKUs (uniform and skewed) ÷ orders/s on one SKU
//     is at least 0.8, and over 10,000 SKUs at least 0.7, prepared before
//     the sale (Coordinator.Prepare) or not;
//
// and issue 27's (one key per order), on the stockctl rows with plenty of
// stock (one, many, many-skewed, many-10k and the prepared two):
//
//   - etcd keys written per served order, by etcd's own count, at most 1.1
//     on one SKU and 1.3 over many SKUs;
//   - the clients' compares per served order at most 1.5;
//   - at most 2 % of the clients' commits refused by their compares;
//   - one SKU at least 0.8× redis-lua's orders/s and 1,000 SKUs (many) at
//     least 0.5× redis-lua's, when redis-lua ran;
//   - one SKU at least 0.5× the physical limit at 64 puts a commit.
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
	one := find(nameStockctl, "one")
	if one != nil && one.OrdersPerSec > 0 {
		for _, shape := range manySKUShapes {
			if m := find(nameStockctl, shape); m != nil {
				want := targetManySKURatio
				if m.Shape.SKUs >= DefaultSaleSKUsLarge {
					want = targetManySKURatioLarge
				}
				ratio := m.OrdersPerSec / one.OrdersPerSec
				detail := fmt.Sprintf("%.0f/s / %.0f/s = %.2f", m.OrdersPerSec, one.OrdersPerSec, ratio)
				if m.LateOrdersPerSec > 0 && one.LateOrdersPerSec > 0 {
					// Not judged: what the run's second half shows of it.
					detail += fmt.Sprintf("; second half %.2f", m.LateOrdersPerSec/one.LateOrdersPerSec)
				}
				judge(fmt.Sprintf("orders/s over %d SKUs (%s) / one SKU >= %.1f", m.Shape.SKUs, shape, want),
					ratio >= want, detail)
			}
		}
	}
	// Issue 27's: what a served order costs etcd.
	var keys, cmps, refused []string
	keysMet, cmpsMet, refusedMet := true, true, true
	for _, shape := range append([]string{"one"}, manySKUShapes...) {
		r := find(nameStockctl, shape)
		if r == nil {
			continue
		}
		c := r.Costs
		if c.KeysPerOrder != nil {
			want := targetKeysManySKUs
			if r.Shape.SKUs == 1 {
				want = targetKeysOneSKU
			}
			keys = append(keys, fmt.Sprintf("%s %.2f (<= %.1f)", shape, *c.KeysPerOrder, want))
			keysMet = keysMet && *c.KeysPerOrder <= want
		}
		if c.ComparesPerOrder != nil {
			cmps = append(cmps, fmt.Sprintf("%s %.2f", shape, *c.ComparesPerOrder))
			cmpsMet = cmpsMet && *c.ComparesPerOrder <= targetComparesPerOrder
		}
		if c.RefusedCommits != nil {
			refused = append(refused, fmt.Sprintf("%s %.1f %%", shape, 100**c.RefusedCommits))
			refusedMet = refusedMet && *c.RefusedCommits <= targetRefusedCommits
		}
	}
	if len(keys) > 0 {
		judge(fmt.Sprintf("etcd keys written per served order <= %.1f on one SKU, <= %.1f over many (etcd's count)", targetKeysOneSKU, targetKeysManySKUs),
			keysMet, strings.Join(keys, ", "))
	}
	if len(cmps) > 0 {
		judge(fmt.Sprintf("compares per served order <= %.1f", targetComparesPerOrder), cmpsMet, strings.Join(cmps, ", "))
	}
	if len(refused) > 0 {
		judge(fmt.Sprintf("commits refused by their compares <= %.0f %%", 100*targetRefusedCommits), refusedMet, strings.Join(refused, ", "))
	}
	for _, cmp := range []struct {
		shape string
		want  float64
	}{{"one", targetOfRedisOne}, {"many", targetOfRedisMany}} {
		st, lua := find(nameStockctl, cmp.shape), find(nameRedisLua, cmp.shape)
		if st != nil && lua != nil && lua.OrdersPerSec > 0 {
			ratio := st.OrdersPerSec / lua.OrdersPerSec
			judge(fmt.Sprintf("orders/s at %s / redis-lua's >= %.1f", cmp.shape, cmp.want), ratio >= cmp.want,
				fmt.Sprintf("%.0f/s / %.0f/s = %.2f", st.OrdersPerSec, lua.OrdersPerSec, ratio))
		}
	}
	limit := find(LimitStrategy, LimitShape(DefaultLimitBatch).Name)
	if one != nil && limit != nil && limit.OrdersPerSec > 0 {
		ratio := one.OrdersPerSec / limit.OrdersPerSec
		judge(fmt.Sprintf("orders/s on one SKU / the physical limit at %d puts a commit >= %.1f", DefaultLimitBatch, targetOfLimit),
			ratio >= targetOfLimit, fmt.Sprintf("%.0f/s / %.0f/s = %.2f", one.OrdersPerSec, limit.OrdersPerSec, ratio))
	}
	return out
}
