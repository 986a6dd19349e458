package bench

import (
	"fmt"
	"os"
	"runtime"
	"strings"
)

// Target statuses.
const (
	TargetMet      = "met"
	TargetNotMet   = "not met"
	TargetMeasured = "measured" // a comparison with no threshold
)

// Target is one of issue 7's targets, judged on a run's rows.
type Target struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
}

// The thresholds of the targets.
const (
	target20OfIdeal  = 0.90
	target20P99Ms    = 60
	target100OfIdeal = 0.75
)

// Targets judges the rows against the project's targets: with 20 segments
// and a step, stockctl reaches 0.90 of the ideal, is ahead of redsync, and
// its p99 is at most 60 ms; with 100 segments it reaches 0.75 of the ideal;
// pure allocation is compared with Redis Lua on one key. A target whose
// rows were not run is left out.
func Targets(rows []Row) []Target {
	find := func(strategy string, n int) *Row {
		for i := range rows {
			if rows[i].Strategy == strategy && rows[i].Segments == n {
				return &rows[i]
			}
		}
		return nil
	}
	status := func(ok bool) string {
		if ok {
			return TargetMet
		}
		return TargetNotMet
	}
	var ts []Target
	if r := find("stockctl", 20); r != nil && r.IdealPerSec > 0 {
		ts = append(ts, Target{Name: "20 segments: ≥ 0.90 of ideal", Status: status(r.OfIdeal >= target20OfIdeal),
			Detail: fmt.Sprintf("%.0f orders/s = %.2f of %.0f", r.OrdersPerSec, r.OfIdeal, r.IdealPerSec)})
		if rs := find("redsync", 20); rs != nil {
			ts = append(ts, Target{Name: "20 segments: ahead of redsync", Status: status(r.OrdersPerSec > rs.OrdersPerSec),
				Detail: fmt.Sprintf("%.0f vs %.0f orders/s (%.2f×); p99 %.1f vs %.1f ms", r.OrdersPerSec, rs.OrdersPerSec,
					ratio(r.OrdersPerSec, rs.OrdersPerSec), r.LatencyMs.P99, rs.LatencyMs.P99)})
		}
		ts = append(ts, Target{Name: "20 segments: p99 ≤ 60 ms (end to end)", Status: status(r.LatencyMs.P99 <= target20P99Ms),
			Detail: fmt.Sprintf("end to end p99 %.1f ms with %d buyers (service p99 %.1f ms)", r.LatencyMs.P99, r.Buyers, r.ServiceMs.P99)})
	}
	if r := find("stockctl", 100); r != nil && r.IdealPerSec > 0 {
		ts = append(ts, Target{Name: "100 segments: ≥ 0.75 of ideal", Status: status(r.OfIdeal >= target100OfIdeal),
			Detail: fmt.Sprintf("%.0f orders/s = %.2f of %.0f", r.OrdersPerSec, r.OfIdeal, r.IdealPerSec)})
	}
	var cmp []string
	for _, r := range rows {
		if r.Strategy != "stockctl-nostep" {
			continue
		}
		if l := find("redis-lua", r.Segments); l != nil {
			cmp = append(cmp, fmt.Sprintf("%d segments: %.0f vs %.0f orders/s = %.3f×", r.Segments, r.OrdersPerSec, l.OrdersPerSec,
				ratio(r.OrdersPerSec, l.OrdersPerSec)))
		}
	}
	if len(cmp) > 0 {
		ts = append(ts, Target{Name: "pure allocation vs Redis Lua on one key", Status: TargetMeasured, Detail: strings.Join(cmp, "; ")})
	}
	return ts
}

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
