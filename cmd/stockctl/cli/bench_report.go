package cli

import (
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
)

// benchReport is bench's result (its -o json shape).
type benchReport struct {
	Config  benchConfig    `json:"config"`
	Machine bench.Machine  `json:"machine"`
	Rows    []bench.Row    `json:"rows"`
	Targets []bench.Target `json:"targets"`
	// OK is true when every run's checks passed; Failures says which did
	// not.
	OK       bool     `json:"ok"`
	Failures []string `json:"failures"`
}

func (r benchReport) table() table {
	var t table
	m := r.Machine
	t.add("MACHINE", fmt.Sprintf("%d CPUs (%s), %s, %s", m.CPUs, m.CPUModel, m.GoVersion, m.OS))
	t.add("LOAD AVERAGE", fmt.Sprintf("%s before, %s after", m.LoadAvgStart, m.LoadAvgEnd))
	t.add("ETCD", r.Config.Etcd)
	if r.Config.Redis != "" {
		t.add("REDIS", r.Config.Redis)
	}
	t.header = []string{"STRATEGY", "SEGMENTS", "BUYERS", "ORDERS", "ORDERS/S", "IDEAL", "OF IDEAL", "P50", "P99", "MAX", "SERVICE P99",
		"REFILLS", "REFILL P99", "PER BUYER", "OVERSOLD", "CHECK"}
	for _, row := range r.Rows {
		ideal, of, svc := "-", "-", "-"
		if row.IdealPerSec > 0 {
			ideal, of, svc = fmt.Sprintf("%.0f", row.IdealPerSec), fmt.Sprintf("%.2f", row.OfIdeal), msText(row.ServiceMs.P99)
		}
		refills, refillP99 := "-", "-"
		if row.Refills != nil {
			refills = fmt.Sprint(*row.Refills)
		}
		if row.RefillMs != nil {
			refillP99 = msText(row.RefillMs.P99)
		}
		check := "ok"
		if !row.OK {
			check = "FAILED"
		}
		t.rows = append(t.rows, []string{row.Strategy, fmt.Sprint(row.Segments), fmt.Sprint(row.Buyers), fmt.Sprint(row.Orders),
			fmt.Sprintf("%.0f", row.OrdersPerSec), ideal, of, msText(row.LatencyMs.P50), msText(row.LatencyMs.P99), msText(row.LatencyMs.Max),
			svc, refills, refillP99, fmt.Sprintf("%d-%d", row.OrdersPerBuyer.Min, row.OrdersPerBuyer.Max), fmt.Sprint(row.Oversold), check})
	}
	t.notes = append(t.notes, "", "P50/P99/MAX: end to end, queueing included (with B closed-loop buyers, at least B ÷ throughput);",
		"SERVICE P99: from holding the lock (the step's start) to the order's return;",
		"REFILLS, REFILL P99 (stockctl's pool and rebalancer): from a segment's stock falling below its low watermark to stock arriving in its inbox.")
	// The targets are set on an embedded etcd with fsync, 4
	// processes and buyers spread over them; the rows cannot say so.
	if c := r.Config; len(r.Targets) > 0 && (c.Etcd != benchIssueEtcd || c.Processes != bench.DefaultProcesses || c.Affinity != string(bench.Spread)) {
		t.notes = append(t.notes, fmt.Sprintf("The targets are set on etcd %s, %d processes (%s); this run: etcd %s, %d processes (%s).",
			benchIssueEtcd, bench.DefaultProcesses, bench.Spread, c.Etcd, c.Processes, c.Affinity))
	}
	for _, tg := range r.Targets {
		t.notes = append(t.notes, fmt.Sprintf("TARGET %s: %s (%s)", tg.Name, strings.ToUpper(tg.Status), tg.Detail))
	}
	for _, f := range r.Failures {
		t.notes = append(t.notes, "FAILED: "+f)
	}
	return t
}

// benchProgress draws bench's live progress on one line of stderr.
type benchProgress struct {
	mu    sync.Mutex
	w     io.Writer // nil: no progress line
	width int
}

func newBenchProgress(w io.Writer, mode string) *benchProgress {
	p := &benchProgress{}
	if mode == "always" || (mode == "auto" && isTerminal(w)) {
		p.w = w
	}
	return p
}

func (p *benchProgress) update(pr bench.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w == nil {
		return
	}
	line := fmt.Sprintf("bench %d/%d · %s · %d segments · %d buyers: %d orders · %.0f orders/s · %d errors · %.1fs",
		pr.Run, pr.Runs, pr.Strategy, pr.Segments, pr.Buyers, pr.Orders, pr.Rate, pr.Errors, pr.Elapsed.Seconds())
	pad := max(0, p.width-len(line))
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
}

// clear blanks the progress line out.
func (p *benchProgress) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w != nil && p.width > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
		p.width = 0
	}
}
