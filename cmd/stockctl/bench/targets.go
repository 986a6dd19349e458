package bench

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Target statuses.
const (
	TargetMet    = "met"
	TargetNotMet = "not met"
	// TargetMeasured: the figures are there, but the target cannot be
	// judged on them (a peer it is compared with did not run, or the run
	// was not under the target's conditions).
	TargetMeasured = "measured"
)

// Target is one of issue 11's targets, judged on a run's rows.
type Target struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
}

// The targets' conditions and thresholds (issue 11). The issue measures
// them in one run on an embedded etcd with fsync, 4 processes and buyers
// spread over them; the rows do not say so, the caller does.
const (
	targetStepMs         = 20 // the step the ideal-rate targets are set at
	target20x200OfIdeal  = 0.95
	target20x40OfIdeal   = 0.90
	target100x200OfIdeal = 0.80
	targetNoStepPerSec   = 15_000
	targetFairness       = 0.8
	targetRefillP99Ms    = 50
)

// The strategies the targets judge or compare with.
const (
	nameStockctl = "stockctl"
	nameNoStep   = "stockctl-nostep"
	nameRedsync  = "redsync"
	nameRedisLua = "redis-lua"
)

// Targets judges the rows against issue 11's targets:
//
//   - stockctl at 20 segments × 200 buyers reaches 0.95 of the ideal;
//   - at 20 segments × 40 buyers, 0.90 of the ideal and at least redsync's
//     rate at the same shape;
//   - at 100 segments × 200 buyers, 0.80 of the ideal and at least
//     redsync's rate;
//   - stockctl-nostep at 20 segments × 200 buyers makes 15,000 allocations
//     a second (compared with redis-lua at that shape when it ran);
//   - fairness: the fewest orders a buyer got over the most, in every
//     stockctl run with a step, is at least 0.8 (the worst run counts);
//   - refills: in every stockctl run with a step, the p99 from a segment
//     crossing its low watermark to stock arriving is at most 50 ms (the
//     worst run counts);
//   - and issue 20's: stockctl-api makes at least 0.6× stockctl-nostep's
//     rate at each shape both ran, and at 200 buyers adds at most 3 ms
//     to its p99 (apiTargets).
//
// A target is judged only when its rows exist; one whose rows ran at
// another step than 20 ms, or whose redsync peer did not run while its own
// threshold was met, is TargetMeasured.
func Targets(rows []Row) []Target {
	find := func(strategy string, segs, buyers int) *Row {
		for i := range rows {
			if r := &rows[i]; r.Strategy == strategy && r.Segments == segs && r.Buyers == buyers {
				return r
			}
		}
		return nil
	}
	var ts []Target
	for _, tg := range []struct {
		segs, buyers int
		ofIdeal      float64
		vsRedsync    bool
	}{
		{20, 200, target20x200OfIdeal, false},
		{20, 40, target20x40OfIdeal, true},
		{100, 200, target100x200OfIdeal, true},
	} {
		r := find(nameStockctl, tg.segs, tg.buyers)
		if r == nil || r.IdealPerSec == 0 {
			continue
		}
		name := fmt.Sprintf("%d segments × %d buyers, %d ms step: ≥ %.2f of ideal", tg.segs, tg.buyers, targetStepMs, tg.ofIdeal)
		var rs *Row
		if tg.vsRedsync {
			name += " and ≥ redsync"
			rs = find(nameRedsync, tg.segs, tg.buyers)
		}
		ts = append(ts, ofIdealTarget(name, r, tg.ofIdeal, tg.vsRedsync, rs))
	}
	if r := find(nameNoStep, 20, 200); r != nil {
		tg := Target{Name: fmt.Sprintf("pure allocation (%s), 20 segments × 200 buyers: ≥ %s allocations/s", nameNoStep, thousands(targetNoStepPerSec)),
			Status: status(r.OrdersPerSec >= targetNoStepPerSec), Detail: fmt.Sprintf("%s allocations/s", thousands(r.OrdersPerSec))}
		if l := find(nameRedisLua, 20, 200); l != nil {
			tg.Detail += fmt.Sprintf("; redis-lua %s (%.2f×)", thousands(l.OrdersPerSec), ratio(r.OrdersPerSec, l.OrdersPerSec))
		}
		ts = append(ts, tg)
	}
	var step []*Row // stockctl's runs with a step, in run order
	for i := range rows {
		if rows[i].Strategy == nameStockctl && rows[i].StepMs > 0 {
			step = append(step, &rows[i])
		}
	}
	if len(step) > 0 {
		ts = append(ts, fairnessTarget(step))
	}
	if t, ok := refillTarget(step); ok {
		ts = append(ts, t)
	}
	return append(ts, apiTargets(rows)...)
}

// ofIdealTarget judges r's share of the ideal against threshold and, with
// vsRedsync, its rate against redsync's row rs (nil: redsync did not run).
func ofIdealTarget(name string, r *Row, threshold float64, vsRedsync bool, rs *Row) Target {
	t := Target{Name: name, Detail: fmt.Sprintf("%.0f orders/s = %.2f of %.0f", r.OrdersPerSec, r.OfIdeal, r.IdealPerSec)}
	met := r.OfIdeal >= threshold
	if vsRedsync && rs == nil {
		t.Detail += "; redsync not run"
	} else if vsRedsync {
		t.Detail += fmt.Sprintf("; redsync %.0f (%.2f×)", rs.OrdersPerSec, ratio(r.OrdersPerSec, rs.OrdersPerSec))
		met = met && r.OrdersPerSec >= rs.OrdersPerSec
	}
	switch {
	case r.StepMs != targetStepMs:
		t.Status = TargetMeasured
		t.Detail += fmt.Sprintf("; at a %s ms step, the target is set at %d ms", trim(r.StepMs), targetStepMs)
	case !met:
		t.Status = TargetNotMet // below the threshold, or behind redsync
	case vsRedsync && rs == nil:
		t.Status = TargetMeasured
	default:
		t.Status = TargetMet
	}
	return t
}

// fairnessTarget judges min/max orders per buyer in each of rows (stockctl
// with a step), reporting the worst.
func fairnessTarget(rows []*Row) Target {
	var worst *Row
	var worstRatio float64
	for _, r := range rows {
		f := fairness(r)
		if worst == nil || f < worstRatio {
			worst, worstRatio = r, f
		}
	}
	return Target{Name: fmt.Sprintf("fairness: min/max orders per buyer ≥ %.1f (%s, every run with a step)", targetFairness, nameStockctl),
		Status: status(worstRatio >= targetFairness),
		Detail: fmt.Sprintf("worst %.2f (%d/%d orders) at %s, of %d runs", worstRatio, worst.OrdersPerBuyer.Min, worst.OrdersPerBuyer.Max,
			shapeText(worst), len(rows))}
}

// fairness is the fewest orders a buyer got over the most (0 when no buyer
// got any).
func fairness(r *Row) float64 {
	return ratio(float64(r.OrdersPerBuyer.Min), float64(r.OrdersPerBuyer.Max))
}

// refillTarget judges the refill p99 of each of rows (stockctl with a
// step) that was observed, reporting the worst; ok is false when none was.
func refillTarget(rows []*Row) (t Target, ok bool) {
	t.Name = fmt.Sprintf("refill p99 ≤ %d ms after a segment crosses its low watermark, under the sale (%s, every run with a step)",
		targetRefillP99Ms, nameStockctl)
	var worst *Row
	var observed, refills, pending int64
	for _, r := range rows {
		if r.Refills == nil {
			continue
		}
		observed++
		refills += *r.Refills
		if r.RefillsPending != nil {
			pending += *r.RefillsPending
		}
		if r.RefillMs != nil && (worst == nil || r.RefillMs.P99 > worst.RefillMs.P99) {
			worst = r
		}
	}
	if observed == 0 {
		return t, false
	}
	switch {
	case worst == nil && pending == 0:
		t.Status = TargetMeasured
		t.Detail = fmt.Sprintf("no segment fell below its low watermark in %d runs", observed)
	case worst == nil:
		t.Status = TargetMeasured
		t.Detail = fmt.Sprintf("no refill seen in %d runs", observed)
	default:
		l := worst.RefillMs
		t.Status = status(l.P99 <= targetRefillP99Ms)
		t.Detail = fmt.Sprintf("worst p99 %.1f ms at %s (%d refills, p50 %.1f, max %.1f ms); %d refills in %d runs",
			l.P99, shapeText(worst), *worst.Refills, l.P50, l.Max, refills, observed)
	}
	if pending > 0 {
		t.Detail += fmt.Sprintf("; %d segments still waiting when their sale ended", pending)
	}
	return t, true
}

func status(ok bool) string {
	if ok {
		return TargetMet
	}
	return TargetNotMet
}

func shapeText(r *Row) string { return fmt.Sprintf("%d segments × %d buyers", r.Segments, r.Buyers) }

// thousands writes v rounded, with a comma between thousands: 15,000.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// trim writes v without trailing zeros: 20, 2.5.
func trim(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Machine describes where a bench ran.
type Machine struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpuModel"`
	GoVersion string `json:"goVersion"`
	OS        string `json:"os"`
	// LoadAvg is /proc/loadavg's 1, 5 and 15 minute figures, read before
	// and after the runs (other work on the machine skews the figures).
	LoadAvgStart string `json:"loadAvgStart"`
	LoadAvgEnd   string `json:"loadAvgEnd"`
}

// ReadMachine describes this machine (load average as of now, in both
// fields; set LoadAvgEnd again after the run).
func ReadMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH,
		CPUModel: "unknown", LoadAvgStart: LoadAvg()}
	m.LoadAvgEnd = m.LoadAvgStart
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// LoadAvg is the 1, 5 and 15 minute load averages, or "unknown".
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
