package cli

import (
	"strings"
	"testing"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
)

// bench --strategies stockctl-nostep,stockctl-api: the API's rows come
// from real `stockctl serve` processes (the built binary) on the bench's
// etcd, balance their books, and are compared with the in-process rows of
// their shape; the serve processes are gone and the keys deleted after.
func TestBenchAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	args := append([]string{"-o", "json"}, append(tinyBench, "--runs", "2x4,3x6", "--strategies", "stockctl-nostep,stockctl-api",
		"--serve-bin", stockctlBinary(t))...)
	r := e.run(args...)
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	var rep benchReport
	decode(t, r.stdout, &rep)
	var got []string
	for _, row := range rep.Rows {
		got = append(got, row.Strategy)
		if !row.OK || row.Oversold != 0 || row.Orders == 0 || row.Books.Sold < row.Orders || row.Books.Sold+row.Books.Remaining != row.Books.Stock {
			t.Errorf("%s at %dx%d: %+v", row.Strategy, row.Segments, row.Buyers, row)
		}
		if row.Refills == nil {
			t.Errorf("%s: no refill figures", row.Strategy)
		}
	}
	if want := "stockctl-nostep stockctl-api stockctl-nostep stockctl-api"; strings.Join(got, " ") != want {
		t.Fatalf("rows %q, want %q", got, want)
	}
	var api []bench.Target
	for _, tg := range rep.Targets {
		if strings.HasPrefix(tg.Name, "pure allocation through the API") {
			api = append(api, tg)
		}
	}
	if len(api) != 2 || !strings.Contains(api[0].Name, "2 segments × 4 buyers") || !strings.Contains(api[0].Detail, "×); p99") {
		t.Fatalf("the API's targets: %+v", api)
	}
	if fp := fingerprint(t, e.prefix); len(fp) != 0 {
		t.Errorf("%d keys left under %s", len(fp), e.prefix)
	}

	// Not in the default set; a missing --serve-bin is a usage error.
	specs, err := benchSpecs(benchConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if s.Name == bench.NameStockctlAPI {
			t.Fatalf("%s runs by default", s.Name)
		}
	}
	e.fails(ExitUsage, "invalid --serve-bin", "bench", "--strategies", "stockctl-api", "--serve-bin", "/nonexistent/stockctl")
}
