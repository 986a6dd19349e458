package cli

import (
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
)

// tinyBench is a bench that finishes in a few seconds: a 1 ms step, 300 ms
// per run; add the shapes.
var tinyBench = []string{"bench", "--step", "1ms", "--duration", "300ms", "--orders", "5000", "--processes", "2"}

// bench against a given etcd: every strategy of the main module, as JSON,
// nothing oversold, the books balanced.
func TestBenchJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run(append([]string{"-o", "json"}, append(tinyBench, "--segments", "2")...)...)
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	checkShape(t, "bench", r.stdout, "config", "machine", "rows", "targets", "ok", "failures")
	var rep benchReport
	decode(t, r.stdout, &rep)
	if !rep.OK || len(rep.Failures) != 0 || len(rep.Rows) != 5 || rep.Machine.CPUs < 1 {
		t.Fatalf("bench report: %+v", rep)
	}
	want := []string{"one-lock", "etcd-mutex", "stockctl", "stockctl-nostep", "stockctl-reserve"}
	for i, row := range rep.Rows {
		if row.Strategy != want[i] || row.Segments != 2 || row.Buyers != bench.BuyersFor(2) {
			t.Errorf("row %d: %+v", i, row)
		}
		if observed := strings.HasPrefix(row.Strategy, "stockctl"); observed != (row.Refills != nil) {
			t.Errorf("%s: refills %v", row.Strategy, row.Refills)
		}
		if !row.OK || row.Oversold != 0 || row.Orders == 0 || row.Books.Sold < row.Orders || row.Books.Sold+row.Books.Remaining != row.Books.Stock {
			t.Errorf("%s: %+v", row.Strategy, row)
		}
	}
	if rep.Config.Etcd != "--endpoints "+shared.endpoints || rep.Config.Affinity != "spread" ||
		!slices.Equal(rep.Config.Runs, []bench.Shape{{Segments: 2, Buyers: bench.BuyersFor(2)}}) {
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
	r := run(t, append(tinyBench, "--runs", "2x4,3x3,2x2", "--strategies", "stockctl,etcd-mutex", "--plot", plot, "--progress", "always",
		"--unsafe-no-fsync")...)
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, want := range []string{"bench: etcd-mutex, stockctl at 2x4,2x2,3x3 (segments x buyers)", "ETCD          embedded, fsync off",
		"STRATEGY    SEGMENTS  BUYERS  ORDERS  ORDERS/S  IDEAL  OF IDEAL", "SERVICE P99  REFILLS  REFILL P99  PER BUYER",
		"The targets are set on etcd embedded, fsync on, 4 processes (spread); this run: etcd embedded, fsync off, 2 processes (spread)."} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("bench table lacks %q:\n%s", want, r.stdout)
		}
	}
	// The rows, in run order: shapes of one segment count together, the
	// strategies one after another at each; refills only for stockctl.
	var got []string
	for _, line := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(line)
		if len(f) != 16 || (f[0] != "stockctl" && f[0] != "etcd-mutex") {
			continue
		}
		got = append(got, f[0]+" "+f[1]+"x"+f[2])
		refills, p99 := f[11], f[12]
		if f[0] == "etcd-mutex" && (refills != "-" || p99 != "-") {
			t.Errorf("etcd-mutex has refill figures: %q", line)
		}
		if n, err := strconv.Atoi(refills); f[0] == "stockctl" && (err != nil || n < 0 || (n == 0) != (p99 == "-")) {
			t.Errorf("stockctl's refill figures: %q", line)
		}
	}
	want := []string{"etcd-mutex 2x4", "stockctl 2x4", "etcd-mutex 2x2", "stockctl 2x2", "etcd-mutex 3x3", "stockctl 3x3"}
	if !slices.Equal(got, want) {
		t.Errorf("rows %q, want %q:\n%s", got, want, r.stdout)
	}
	if !strings.Contains(r.stderr, "\rbench 1/6 · etcd-mutex · 2 segments · 4 buyers") || strings.Contains(r.stdout, "\rbench") {
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
		{"segments zero", []string{"--segments", "0"}, `invalid --segments "0": entry "0"`},
		{"segments text", []string{"--segments", "1,x"}, `entry "x"`},
		{"segments twice", []string{"--segments", "2,3,2"}, "2 is given twice"},
		{"runs bare count", []string{"--runs", "20x40,20"}, `invalid --runs "20x40,20": entry "20": want SEGMENTSxBUYERS`},
		{"runs empty entry", []string{"--runs", "20x40,"}, `entry "": want SEGMENTSxBUYERS`},
		{"runs empty", []string{"--runs", ""}, `entry "": want SEGMENTSxBUYERS`},
		{"runs no buyers", []string{"--runs", "20x"}, `entry "20x": buyers must be a count`},
		{"runs no segments", []string{"--runs", "x40"}, `entry "x40": segments must be a count`},
		{"runs zero segments", []string{"--runs", "0x40"}, `entry "0x40": segments must be a count from 1 to 1024`},
		{"runs too many segments", []string{"--runs", "1025x40"}, `entry "1025x40": segments`},
		{"runs zero buyers", []string{"--runs", "20x0"}, `entry "20x0": buyers must be a count from 1 to 100000`},
		{"runs negative buyers", []string{"--runs", "20x-4"}, `entry "20x-4": buyers`},
		{"runs too many buyers", []string{"--runs", "1x100001"}, `entry "1x100001": buyers`},
		{"runs three parts", []string{"--runs", "20x40x2"}, `entry "20x40x2": buyers`},
		{"runs twice", []string{"--runs", "20x40,100x200,20x40"}, `entry "20x40" is given twice`},
		{"runs with segments", []string{"--runs", "20x40", "--segments", "20"}, "--runs cannot be given with --segments or --buyers"},
		{"runs with buyers", []string{"--buyers", "40", "--runs", "20x40"}, "--runs cannot be given with --segments or --buyers"},
		{"runs with buyers 0", []string{"--buyers", "0", "--runs", "20x40"}, "--runs cannot be given with --segments or --buyers"},
		{"unknown strategy", []string{"--strategies", "stockctl,nope"}, `unknown strategy "nope"`},
		{"redis not loopback", []string{"--redis", "10.0.0.1:6379"}, "not a loopback address"},
		{"redis without peers", []string{"--redis", "127.0.0.1:6379"}, "built without the Redis peers"},
		{"plot png", []string{"--plot", "x.png"}, "name a .svg file"},
		{"step", []string{"--step", "0s"}, "invalid --step"},
		{"duration", []string{"--duration", "-1s"}, "invalid --duration"},
		{"orders", []string{"--orders", "0"}, "invalid --orders"},
		{"buyers", []string{"--buyers", "-3"}, "invalid --buyers -3"},
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

// The shapes bench runs, from --runs or from --segments and --buyers.
func TestBenchRuns(t *testing.T) {
	sh := func(segs, buyers int) bench.Shape { return bench.Shape{Segments: segs, Buyers: buyers} }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []bench.Shape
	}{
		{"default", nil, nil, []bench.Shape{sh(1, 2), sh(20, 40), sh(20, 200), sh(100, 200)}},
		{"runs", []string{"--runs", "20x40,20x200,100x200"}, nil, []bench.Shape{sh(20, 40), sh(20, 200), sh(100, 200)}},
		{"runs grouped", []string{"--runs", "20x40, 100x200 ,20X200"}, nil, []bench.Shape{sh(20, 40), sh(20, 200), sh(100, 200)}},
		{"runs from the environment", nil, map[string]string{"STOCKCTL_BENCH_RUNS": "4x8"}, []bench.Shape{sh(4, 8)}},
		{"segments", []string{"--segments", "1,20,100"}, nil, []bench.Shape{sh(1, 2), sh(20, 40), sh(100, 200)}},
		{"segments and buyers", []string{"--segments", "20,100", "--buyers", "200"}, nil, []bench.Shape{sh(20, 200), sh(100, 200)}},
		{"buyers only", []string{"--buyers", "50"}, nil, []bench.Shape{sh(1, 50), sh(20, 50), sh(100, 50)}},
		{"buyers 0", []string{"--buyers", "0"}, nil, []bench.Shape{sh(1, 2), sh(20, 40), sh(100, 200)}},
		{"segments from the environment", nil, map[string]string{"STOCKCTL_BENCH_SEGMENTS": "300"}, []bench.Shape{sh(300, bench.MaxDefaultBuyers)}},
		{"runs in the environment, segments given", []string{"--segments", "3"}, map[string]string{"STOCKCTL_BENCH_RUNS": "4x8"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var got []bench.Shape
			var runErr error
			app := &ucli.App{Name: "bench", Flags: benchCommand().Flags, ExitErrHandler: func(*ucli.Context, error) {},
				Writer: io.Discard, ErrWriter: io.Discard,
				Action: func(c *ucli.Context) error { got, runErr = benchRuns(c); return runErr }}
			if err := app.Run(append([]string{"bench"}, tc.args...)); err != nil && runErr == nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if ExitCode(runErr) != ExitUsage || !strings.Contains(runErr.Error(), "--runs cannot be given with --segments or --buyers") {
					t.Fatalf("%v: %v, want the conflict", tc.args, runErr)
				}
				return
			}
			if runErr != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("%v: %v %v, want %v", tc.args, got, runErr, tc.want)
			}
		})
	}
}

// bench --sale --clusters: a count from 2 to 8, on embedded etcds only.
func TestBenchSaleClustersUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.fails(ExitUsage, "invalid --clusters 1: must be between 2 and 8", "bench", "--sale", "--clusters", "1")
	e.fails(ExitUsage, "invalid --clusters 9", "bench", "--sale", "--clusters", "9")
	e.fails(ExitUsage, "--clusters starts embedded etcd clusters: it cannot be given with --endpoints", "bench", "--sale", "--clusters", "3")
}
