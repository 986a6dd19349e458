package cli

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockctl/stockctl/internal/bench"
)

// tinyBench is a bench that finishes in a few seconds: 2 segments, a 1 ms
// step, 300 ms per run.
var tinyBench = []string{"bench", "--segments", "2", "--step", "1ms", "--duration", "300ms", "--orders", "5000", "--processes", "2"}

// bench against a given etcd: every strategy of the main module, as JSON,
// nothing oversold, the books balanced.
func TestBenchJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run(append([]string{"-o", "json"}, tinyBench...)...)
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	checkShape(t, "bench", r.stdout, "config", "machine", "rows", "targets", "ok", "failures")
	var rep benchReport
	decode(t, r.stdout, &rep)
	if !rep.OK || len(rep.Failures) != 0 || len(rep.Rows) != 4 || rep.Machine.CPUs < 1 {
		t.Fatalf("bench report: %+v", rep)
	}
	want := []string{"one-lock", "etcd-mutex", "stockctl", "stockctl-nostep"}
	for i, row := range rep.Rows {
		if row.Strategy != want[i] || row.Segments != 2 || row.Buyers != bench.BuyersFor(2) {
			t.Errorf("row %d: %+v", i, row)
		}
		if !row.OK || row.Oversold != 0 || row.Orders == 0 || row.Books.Sold < row.Orders || row.Books.Sold+row.Books.Remaining != row.Books.Stock {
			t.Errorf("%s: %+v", row.Strategy, row)
		}
	}
	if rep.Config.Etcd != "--endpoints "+shared.endpoints || rep.Config.Affinity != "spread" {
		t.Errorf("config %+v", rep.Config)
	}
	// The runs cleaned up after themselves.
	if fp := fingerprint(t, e.prefix); len(fp) != 0 {
		t.Errorf("%d keys left under %s", len(fp), e.prefix)
	}
}

// bench on its own embedded etcd, as a table, with the plot and the
// progress line.
func TestBenchTablePlot(t *testing.T) {
	t.Parallel()
	plot := filepath.Join(t.TempDir(), "bench.svg")
	r := run(t, append(tinyBench, "--strategies", "stockctl,etcd-mutex", "--plot", plot, "--progress", "always", "--unsafe-no-fsync")...)
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, want := range []string{"bench: etcd-mutex, stockctl at 2 segments", "ETCD          embedded, fsync off",
		"STRATEGY    SEGMENTS  BUYERS  ORDERS  ORDERS/S  IDEAL  OF IDEAL", "SERVICE P99"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("bench table lacks %q:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "\rbench 1/2 · etcd-mutex · 2 segments") || strings.Contains(r.stdout, "\rbench") {
		t.Errorf("progress line: stderr %q", r.stderr)
	}
	b, err := os.ReadFile(plot)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b, new(struct{})); err != nil || !strings.Contains(string(b), "<polyline") {
		t.Fatalf("plot: %v\n%s", err, b)
	}
}

func TestBenchUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"segments zero", []string{"--segments", "0"}, "invalid --segments"},
		{"segments text", []string{"--segments", "1,x"}, "invalid --segments"},
		{"unknown strategy", []string{"--strategies", "stockctl,nope"}, `unknown strategy "nope"`},
		{"redis not loopback", []string{"--redis", "10.0.0.1:6379"}, "not a loopback address"},
		{"redis without peers", []string{"--redis", "127.0.0.1:6379"}, "built without the Redis peers"},
		{"plot png", []string{"--plot", "x.png"}, "name a .svg file"},
		{"step", []string{"--step", "0s"}, "invalid --step"},
		{"duration", []string{"--duration", "-1s"}, "invalid --duration"},
		{"orders", []string{"--orders", "0"}, "invalid --orders"},
		{"buyers", []string{"--buyers", "-3"}, "invalid --buyers"},
		{"processes", []string{"--processes", "0"}, "invalid --processes"},
		{"affinity", []string{"--affinity", "sticky"}, "invalid --affinity"},
		{"progress", []string{"--progress", "maybe"}, "invalid --progress"},
		{"argument", []string{"extra"}, "bench takes no arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"bench"}, tc.args...)
			before := fingerprint(t, e.prefix)
			r := e.fails(ExitUsage, tc.want, args...)
			if r.stdout != "" || len(fingerprint(t, e.prefix)) != len(before) {
				t.Fatalf("a usage error ran something: stdout %q", r.stdout)
			}
		})
	}
}
