package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/stockctl/stockctl/internal/embedetcd"
	"github.com/stockctl/stockctl/segments"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startEtcd starts an embedded etcd for one test and returns n clients.
func startEtcd(t *testing.T, n int, opts ...grpc.DialOption) []*clientv3.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cs := make([]*clientv3.Client, n)
	for i := range cs {
		c, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: opts})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs
}

func TestEvenRouteKeys(t *testing.T) {
	for _, tc := range []struct{ buyers, n int }{{2, 1}, {40, 20}, {7, 3}, {200, 100}} {
		keys, err := evenRouteKeys(tc.buyers, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		for b, k := range keys {
			if got := segments.Route(k, tc.n); got != b%tc.n {
				t.Fatalf("%d buyers on %d segments: buyer %d's key %q routes to %d", tc.buyers, tc.n, b, k, got)
			}
		}
	}
}

func TestProcess(t *testing.T) {
	spread := Params{Segments: 20, Processes: 4}
	seg := Params{Segments: 20, Processes: 4, Affinity: SegmentAffinity}
	for s := range 20 {
		// A segment's two buyers (s and s+20).
		if spread.Process(s) == spread.Process(s+20) {
			t.Errorf("spread: segment %d's buyers share process %d", s, spread.Process(s))
		}
		if seg.Process(s) != seg.Process(s+20) {
			t.Errorf("segment affinity: segment %d's buyers in processes %d and %d", s, seg.Process(s), seg.Process(s+20))
		}
	}
}

func TestBooksOversold(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Books
		want int64
	}{
		{"balanced", Books{Stock: 100, Remaining: 60, Sold: 40}, 0},
		{"lost update", Books{Stock: 100, Remaining: 61, Sold: 40}, 1},
		{"below zero", Books{Stock: 100, Remaining: -2, Negative: 2, Sold: 102}, 2},
		{"unsold records missing", Books{Stock: 100, Remaining: 60, Sold: 39}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.b.Oversold(); got != tc.want {
				t.Fatalf("%+v: oversold %d, want %d", tc.b, got, tc.want)
			}
		})
	}
}

func TestSelect(t *testing.T) {
	all := []Spec{OneLock(), EtcdMutex(), Stockctl(), StockctlNoStep()}
	got, err := Select(all, []string{"stockctl", "one-lock"})
	if err != nil || len(got) != 2 || got[0].Name != "one-lock" || got[1].Name != "stockctl" {
		t.Fatalf("Select: %v %v", got, err)
	}
	if _, err := Select(all, []string{"redsync"}); !errors.Is(err, ErrUnknownStrategy) || !strings.Contains(err.Error(), "available: one-lock") {
		t.Fatalf("Select of an unknown name: %v", err)
	}
}

// leaky is a strategy that hands out stock it never deducts: the books must
// catch it.
type leaky struct{ sold atomic.Int64 }

func (l *leaky) Setup(context.Context, Params) error { return nil }
func (l *leaky) Buy(context.Context, int, string, int64, string) (bool, error) {
	l.sold.Add(1)
	time.Sleep(time.Millisecond)
	return false, nil
}
func (l *leaky) Verify(context.Context) (Books, error) {
	return Books{Stock: 10, Remaining: 10, Sold: l.sold.Load(), Orders: l.sold.Load()}, nil
}
func (l *leaky) Teardown(context.Context) error { return nil }

// Every strategy of this module on a real etcd: tiny runs that must balance
// their books, and a leaky strategy that must be caught.
func TestRun(t *testing.T) {
	cs := startEtcd(t, 2)
	specs := []Spec{OneLock(), EtcdMutex(), Stockctl(), StockctlNoStep(), StockctlReserve(),
		{Name: "leaky", Title: "oversells", New: func() Strategy { return &leaky{} }}}
	var progress atomic.Int64
	rows, err := Run(t.Context(), Config{Specs: specs, Shapes: []Shape{{Segments: 2}}, Step: time.Millisecond, Duration: 300 * time.Millisecond,
		Orders: 2000, Processes: 2, Etcd: cs, Prefix: "/bench-test/", StopGrace: 2 * time.Second,
		Progress: func(Progress) { progress.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(specs) {
		t.Fatalf("%d rows for %d strategies", len(rows), len(specs))
	}
	for _, r := range rows {
		if r.Strategy == "leaky" {
			if r.OK || r.Oversold == 0 || len(r.Problems) == 0 {
				t.Errorf("the leaky strategy passed: %+v", r)
			}
			continue
		}
		if !r.OK || r.Oversold != 0 || r.Orders == 0 || r.OrdersPerSec <= 0 || r.Books.Sold < r.Orders {
			t.Errorf("%s: %+v", r.Strategy, r)
		}
		if step := r.Strategy != "stockctl-nostep" && r.Strategy != "stockctl-reserve"; step != (r.IdealPerSec > 0) || step != (r.ServiceMs.P99 > 0) {
			t.Errorf("%s: ideal %v, service %+v", r.Strategy, r.IdealPerSec, r.ServiceMs)
		}
		if r.Buyers != BuyersFor(2) {
			t.Errorf("%s: %d buyers, want the default %d", r.Strategy, r.Buyers, BuyersFor(2))
		}
		if observed := strings.HasPrefix(r.Strategy, "stockctl"); observed != (r.Refills != nil) || observed != (r.RefillsPending != nil) {
			t.Errorf("%s: refills %v, pending %v", r.Strategy, r.Refills, r.RefillsPending)
		}
	}
	if rows[0].Places != 1 || rows[0].IdealPerSec != 1000 || rows[1].Places != 2 || rows[1].IdealPerSec != 2000 {
		t.Errorf("places and ideals: %+v / %+v", rows[0], rows[1])
	}
	if progress.Load() == 0 {
		t.Error("no progress reported")
	}
	// Every run cleaned up after itself.
	resp, err := cs[0].Get(t.Context(), "/bench-test/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Errorf("%v keys left under the prefix (%v)", resp.Count, err)
	}
}

// Two shapes, stockctl with and without a step: every stockctl row says
// what its refill observer saw, consistently (a tiny run may see none).
func TestRunShapesRefills(t *testing.T) {
	cs := startEtcd(t, 2)
	shapes := []Shape{{Segments: 2, Buyers: 4}, {Segments: 3}}
	rows, err := Run(t.Context(), Config{Specs: []Spec{Stockctl(), StockctlNoStep()}, Shapes: shapes, Step: time.Millisecond,
		Duration: 300 * time.Millisecond, Orders: 1000, Processes: 2, Etcd: cs, Prefix: "/bench-refills/", StopGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		strategy     string
		segs, buyers int
	}{{"stockctl", 2, 4}, {"stockctl-nostep", 2, 4}, {"stockctl", 3, 6}, {"stockctl-nostep", 3, 6}}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	for i, r := range rows {
		w := want[i]
		if r.Strategy != w.strategy || r.Segments != w.segs || r.Buyers != w.buyers || !r.OK {
			t.Errorf("row %d: %s at %dx%d (ok %v, %v), want %s at %dx%d", i, r.Strategy, r.Segments, r.Buyers, r.OK, r.Problems,
				w.strategy, w.segs, w.buyers)
		}
		if r.Refills == nil || r.RefillsPending == nil || *r.Refills < 0 || *r.RefillsPending < 0 || *r.RefillsPending > int64(r.Segments) {
			t.Fatalf("%s at %dx%d: refills %v, pending %v", r.Strategy, r.Segments, r.Buyers, r.Refills, r.RefillsPending)
		}
		if (*r.Refills > 0) != (r.RefillMs != nil) {
			t.Errorf("%s: %d refills, refillMs %v", r.Strategy, *r.Refills, r.RefillMs)
		}
		if l := r.RefillMs; l != nil && !(0 <= l.P50 && l.P50 <= l.P99 && l.P99 <= l.Max) {
			t.Errorf("%s: refill latency %+v", r.Strategy, *l)
		}
	}
	b, err := json.Marshal(rows[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"refills":`, `"refillMs":`, `"refillsPending":`} {
		if !bytes.Contains(b, []byte(f)) {
			t.Errorf("the row's JSON lacks %s: %s", f, b)
		}
	}
}

func TestRunInvalid(t *testing.T) {
	ok := func(shapes ...Shape) Config {
		return Config{Specs: []Spec{OneLock()}, Shapes: shapes, Prefix: "/x/", Processes: 1, Etcd: make([]*clientv3.Client, 1)}
	}
	for name, cfg := range map[string]Config{
		"empty":             {},
		"no shapes":         {Specs: []Spec{OneLock()}},
		"zero segments":     ok(Shape{Segments: 0, Buyers: 2}),
		"too many segments": ok(Shape{Segments: 100000, Buyers: 2}),
		"negative buyers":   ok(Shape{Segments: 2, Buyers: -1}),
		"twice":             ok(Shape{Segments: 2, Buyers: 4}, Shape{Segments: 3}, Shape{Segments: 2, Buyers: 4}),
		"twice by default":  ok(Shape{Segments: 2}, Shape{Segments: 2, Buyers: BuyersFor(2)}),
		"too few clients":   {Specs: []Spec{OneLock()}, Shapes: []Shape{{Segments: 1}}, Prefix: "/x/", Processes: 2, Etcd: make([]*clientv3.Client, 1)},
	} {
		if _, err := Run(t.Context(), cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestRunOrder(t *testing.T) {
	sh := func(segs, buyers int) Shape { return Shape{Segments: segs, Buyers: buyers} }
	for _, tc := range []struct {
		name     string
		in, want []Shape
	}{
		{"empty", nil, []Shape{}},
		{"default buyers", []Shape{sh(1, 0), sh(20, 0), sh(300, 0)},
			[]Shape{sh(1, 2), sh(20, 40), sh(300, MaxDefaultBuyers)}},
		{"issue 11", []Shape{sh(1, 2), sh(20, 40), sh(20, 200), sh(100, 200)}, []Shape{sh(1, 2), sh(20, 40), sh(20, 200), sh(100, 200)}},
		{"grouped by segment count", []Shape{sh(20, 40), sh(100, 200), sh(1, 2), sh(20, 200), sh(100, 0)},
			[]Shape{sh(20, 40), sh(20, 200), sh(100, 200), sh(100, 200), sh(1, 2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.in)
			if got := RunOrder(tc.in); !slices.Equal(got, tc.want) {
				t.Errorf("RunOrder(%v) = %v, want %v", tc.in, got, tc.want)
			}
			if !slices.Equal(in, tc.in) {
				t.Errorf("RunOrder changed its argument: %v", tc.in)
			}
		})
	}
}

func TestTargets(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	// row builds a run of strategy at segs × buyers, 20 ms step (0 for
	// stockctl-nostep and redis-lua), fair unless told.
	row := func(strategy string, segs, buyers int, perSec float64) Row {
		r := Row{Strategy: strategy, Segments: segs, Places: segs, Buyers: buyers, OrdersPerSec: perSec,
			OrdersPerBuyer: MinMax{Min: 9, Max: 10}}
		if strategy != "stockctl-nostep" && strategy != "redis-lua" {
			r.StepMs, r.IdealPerSec = 20, float64(segs)*50
			r.OfIdeal = perSec / r.IdealPerSec
		}
		return r
	}
	refills := func(r Row, count int64, p99 float64) Row {
		r.Refills, r.RefillsPending = n(count), n(0)
		if count > 0 {
			r.RefillMs = &Latency{P50: p99 / 2, P99: p99, Max: p99 + 1}
		}
		return r
	}
	fairness := func(r Row, min, max int64) Row { r.OrdersPerBuyer = MinMax{Min: min, Max: max}; return r }
	step := func(r Row, ms float64) Row {
		r.StepMs, r.IdealPerSec = ms, float64(r.Places)*1000/ms
		r.OfIdeal = r.OrdersPerSec / r.IdealPerSec
		return r
	}
	const (
		t20x200  = "20 segments × 200 buyers, 20 ms step: ≥ 0.95 of ideal"
		t20x40   = "20 segments × 40 buyers, 20 ms step: ≥ 0.90 of ideal and ≥ redsync"
		t100x200 = "100 segments × 200 buyers, 20 ms step: ≥ 0.80 of ideal and ≥ redsync"
		tNoStep  = "pure allocation (stockctl-nostep), 20 segments × 200 buyers: ≥ 15,000 allocations/s"
		tFair    = "fairness: min/max orders per buyer ≥ 0.8 (stockctl, every run with a step)"
		tRefill  = "refill p99 ≤ 50 ms after a segment crosses its low watermark, under the sale (stockctl, every run with a step)"
	)
	type want struct{ status, detail string }
	for _, tc := range []struct {
		name string
		rows []Row
		want map[string]want // name → status and a part of the detail
	}{
		{"no rows", nil, map[string]want{}},
		{"other strategies only", []Row{row("one-lock", 20, 200, 50), row("redsync", 20, 40, 900)}, map[string]want{}},
		{"all met, redsync behind", []Row{
			row("one-lock", 1, 2, 49),
			refills(row("stockctl", 20, 40, 950), 12, 20), row("redsync", 20, 40, 880),
			refills(row("stockctl", 20, 200, 965), 30, 35),
			refills(row("stockctl", 100, 200, 4100), 0, 0), row("redsync", 100, 200, 4000),
			row("stockctl-nostep", 20, 200, 16234), row("redis-lua", 20, 200, 40000),
		}, map[string]want{
			t20x200:  {TargetMet, "965 orders/s = 0.96 of 1000"},
			t20x40:   {TargetMet, "950 orders/s = 0.95 of 1000; redsync 880 (1.08×)"},
			t100x200: {TargetMet, "4100 orders/s = 0.82 of 5000; redsync 4000 (1.02×)"},
			tNoStep:  {TargetMet, "16,234 allocations/s; redis-lua 40,000 (0.41×)"},
			tFair:    {TargetMet, "worst 0.90 (9/10 orders)"},
			tRefill:  {TargetMet, "worst p99 35.0 ms at 20 segments × 200 buyers (30 refills, p50 17.5, max 36.0 ms); 42 refills in 3 runs"},
		}},
		{"redsync ahead", []Row{
			row("stockctl", 20, 40, 950), row("redsync", 20, 40, 960),
			row("stockctl", 100, 200, 4100), row("redsync", 100, 200, 4200),
		}, map[string]want{
			t20x40:   {TargetNotMet, "redsync 960 (0.99×)"},
			t100x200: {TargetNotMet, "redsync 4200 (0.98×)"},
			tFair:    {TargetMet, "of 2 runs"},
		}},
		{"redsync not run", []Row{
			row("stockctl", 20, 40, 950),
			row("stockctl", 100, 200, 3000),
		}, map[string]want{
			t20x40:   {TargetMeasured, "950 orders/s = 0.95 of 1000; redsync not run"},
			t100x200: {TargetNotMet, "3000 orders/s = 0.60 of 5000; redsync not run"},
			tFair:    {TargetMet, ""},
		}},
		{"below the thresholds", []Row{
			fairness(refills(row("stockctl", 20, 200, 900), 5, 80), 3, 10),
			row("stockctl-nostep", 20, 200, 9000),
			refills(row("stockctl-nostep", 100, 200, 20000), 50, 500), // no step: not judged on refills
		}, map[string]want{
			t20x200: {TargetNotMet, "900 orders/s = 0.90 of 1000"},
			tNoStep: {TargetNotMet, "9,000 allocations/s"},
			tFair:   {TargetNotMet, "worst 0.30 (3/10 orders) at 20 segments × 200 buyers, of 1 runs"},
			tRefill: {TargetNotMet, "worst p99 80.0 ms"},
		}},
		{"worst of several", []Row{
			fairness(refills(row("stockctl", 20, 40, 950), 4, 60), 7, 10),
			fairness(refills(row("stockctl", 20, 200, 980), 9, 30), 5, 10),
			fairness(row("stockctl-nostep", 20, 200, 20000), 0, 100), // no step: not judged on fairness
		}, map[string]want{
			t20x200: {TargetMet, ""},
			t20x40:  {TargetMeasured, "redsync not run"},
			tNoStep: {TargetMet, "20,000 allocations/s"},
			tFair:   {TargetNotMet, "worst 0.50 (5/10 orders) at 20 segments × 200 buyers, of 2 runs"},
			tRefill: {TargetNotMet, "worst p99 60.0 ms at 20 segments × 40 buyers"},
		}},
		{"no crossing", []Row{refills(row("stockctl", 20, 200, 960), 0, 0)}, map[string]want{
			t20x200: {TargetMet, ""},
			tFair:   {TargetMet, ""},
			tRefill: {TargetMeasured, "no segment fell below its low watermark in 1 runs"},
		}},
		{"no refill seen, some waiting", []Row{
			func() Row { r := refills(row("stockctl", 20, 200, 960), 0, 0); r.RefillsPending = n(2); return r }(),
		}, map[string]want{
			t20x200: {TargetMet, ""},
			tFair:   {TargetMet, ""},
			tRefill: {TargetMeasured, "no refill seen in 1 runs; 2 segments still waiting when their sale ended"},
		}},
		{"another step", []Row{
			step(row("stockctl", 20, 200, 1900), 10),
			step(row("stockctl", 20, 40, 1000), 10),
		}, map[string]want{
			t20x200: {TargetMeasured, "1900 orders/s = 0.95 of 2000; at a 10 ms step, the target is set at 20 ms"},
			t20x40:  {TargetMeasured, "0.50 of 2000; redsync not run; at a 10 ms step"},
			tFair:   {TargetMet, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Targets(tc.rows)
			seen := map[string]bool{}
			for _, tg := range got {
				w, ok := tc.want[tg.Name]
				switch {
				case !ok:
					t.Errorf("unexpected target %q: %s (%s)", tg.Name, tg.Status, tg.Detail)
				case tg.Status != w.status || !strings.Contains(tg.Detail, w.detail):
					t.Errorf("%s: %s (%s), want %s (%s)", tg.Name, tg.Status, tg.Detail, w.status, w.detail)
				}
				seen[tg.Name] = true
			}
			for name := range tc.want {
				if !seen[name] {
					t.Errorf("target %q missing from %+v", name, got)
				}
			}
		})
	}
}

func TestWriteSVG(t *testing.T) {
	r := func(strategy string, segs, buyers int, perSec float64) Row {
		row := Row{Strategy: strategy, Segments: segs, Places: segs, Buyers: buyers, OrdersPerSec: perSec}
		if strategy == "one-lock" {
			row.Places = 1
		}
		if strategy != "redis-lua" {
			row.StepMs, row.IdealPerSec = 20, float64(row.Places)*50
		}
		return row
	}
	for _, tc := range []struct {
		name      string
		rows      []Row
		polylines int
		legend    []string
	}{
		// The default run: by buyers per segment, 2 per segment is a
		// line through 1, 20 and 100 segments, 10 per segment a marker.
		{"issue 11's shapes", []Row{
			r("one-lock", 1, 2, 40), r("stockctl", 1, 2, 45), r("redis-lua", 1, 2, 30000),
			r("one-lock", 20, 40, 45), r("stockctl", 20, 40, 900), r("redis-lua", 20, 40, 40000),
			r("one-lock", 20, 200, 45), r("stockctl", 20, 200, 950), r("redis-lua", 20, 200, 40000),
			r("one-lock", 100, 200, 45), r("stockctl", 100, 200, 4000), r("redis-lua", 100, 200, 41000),
		}, 4, []string{">10k<", ">stockctl<", ">redis-lua (no step)<", ">2 buyers per segment<", ">10 buyers per segment<", "ideal (segments ÷ step)"}},
		// One buyer count for every segment count: one line per strategy.
		{"--buyers 200", []Row{
			r("one-lock", 1, 200, 40), r("stockctl", 1, 200, 45),
			r("one-lock", 20, 200, 45), r("stockctl", 20, 200, 900),
		}, 3, []string{">one-lock<", ">200 buyers<"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteSVG(&buf, tc.rows, "a <title> & more"); err != nil {
				t.Fatal(err)
			}
			dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
			lines := 0
			for {
				tok, err := dec.Token()
				if err != nil {
					if err.Error() != "EOF" {
						t.Fatalf("not well-formed XML: %v\n%s", err, buf.String())
					}
					break
				}
				if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
					lines++
				}
			}
			if lines != tc.polylines {
				t.Errorf("%d polylines, want %d\n%s", lines, tc.polylines, buf.String())
			}
			for _, want := range append(tc.legend, "a &lt;title&gt; &amp; more") {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("the plot lacks %q", want)
				}
			}
		})
	}
}

// A tiny bench --sale on a real etcd (a few hundred orders: SKUs of small
// stock, and the physical limit capped at 400 puts, by 3 writers on 2
// processes' clients): every row carries
// the per-order costs, from etcd's own counters and the clients', and
// they agree with each other and with what the row did.
func TestRunSaleCosts(t *testing.T) {
	counter := &EtcdCounter{}
	cs := startEtcd(t, 2, grpc.WithChainUnaryInterceptor(counter.Interceptor()))
	shapes := []SaleShape{
		{Name: "one", SKUs: 1, Stock: 300},
		{Name: "many", SKUs: 20, Stock: 15},
		LimitShape(4),
		LimitShape(1),
	}
	rows, err := RunSale(t.Context(), SaleConfig{Specs: []SaleSpec{StockctlSale()}, Shapes: shapes, Buyers: 8, Processes: 2, Segments: 4,
		Duration: time.Second, Etcd: cs, Prefix: "/bench-sale-test/", TruthSample: 5, Counter: counter,
		Server: &EtcdServerMetrics{Gatherer: prometheus.DefaultGatherer, Members: 1}, LimitMaxPuts: 400, LimitWriters: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(shapes) {
		t.Fatalf("%d rows for %d shapes (the limit runs once, without the strategies)", len(rows), len(shapes))
	}
	for _, r := range rows {
		if !r.OK || r.Orders == 0 || r.Etcd == nil || r.EtcdServer == nil {
			t.Fatalf("%s: %+v", r.Shape.Name, r)
		}
		c, cl, sv := r.Costs, *r.Etcd, *r.EtcdServer
		if c.KeysPerOrder == nil || c.DeletesPerOrder == nil || c.ComparesPerOrder == nil || c.TxnsPerOrder == nil ||
			c.OrdersPerCommit == nil || c.RefusedCommits == nil || c.CPUMicrosPerOrder == nil {
			t.Fatalf("%s: a cost missing: %+v", r.Shape.Name, c)
		}
		t.Logf("%s: %d orders, client %+v, server %+v, writes etcd can have applied %v", r.Shape.Name, r.Orders, cl, sv, r.writeBounds)
		n := float64(r.Orders)
		if r.CPUSeconds <= 0 || *c.CPUMicrosPerOrder != r.CPUSeconds*1e6/n {
			t.Errorf("%s: CPU %.3f s, %.1f µs an order: not this process's CPU over the window ÷ %d orders", r.Shape.Name, r.CPUSeconds, *c.CPUMicrosPerOrder, r.Orders)
		}
		if *c.KeysPerOrder != float64(sv.Puts)/n || *c.TxnsPerOrder != float64(cl.Writes)/n || *c.ComparesPerOrder != float64(cl.Compares)/n ||
			*c.OrdersPerCommit != n/float64(sv.Writes) || *c.RefusedCommits != float64(cl.Refused)/float64(cl.Writes) {
			t.Errorf("%s: costs %+v do not follow from the counts (client %+v, server %+v)", r.Shape.Name, c, cl, sv)
		}
		if cl.Refused < 0 || cl.Refused > cl.Writes {
			t.Errorf("%s: %d of %d write transactions refused", r.Shape.Name, cl.Refused, cl.Writes)
		}
		if r.Shape.Batch > 0 {
			// Nothing but the writers wrote: etcd saw one key a put, and
			// the writers' transactions, each with Batch puts.
			b := int64(r.Shape.Batch)
			if r.Strategy != LimitStrategy || sv.Puts != r.Orders || sv.Deletes != 0 || r.Orders%b != 0 ||
				sv.Writes != r.Orders/b || cl.Writes != sv.Writes || cl.Puts != r.Orders || cl.Compares != 0 || cl.Refused != 0 {
				t.Errorf("%s: %d puts; client %+v, server %+v", r.Shape.Name, r.Orders, cl, sv)
			}
			if r.Orders > 400 || r.Buyers != 3 {
				t.Errorf("%s: %d puts by %d writers, capped at 400 by 3", r.Shape.Name, r.Orders, r.Buyers)
			}
			continue
		}
		// A served order writes its record at least (a key of its own),
		// in a transaction that compares something (at least its place's
		// fence); etcd applied as many writes as the clients' counts allow
		// for the writes in flight at the window's edges (writeBounds: a
		// count of the wrong thing, reads or every member's applies, would
		// fall outside).
		if sv.Puts < r.Orders || cl.Compares == 0 || cl.Writes == 0 {
			t.Errorf("%s: %d orders served; client %+v, server %+v", r.Shape.Name, r.Orders, cl, sv)
		}
		// The second half's rate is its orders over the last Seconds-0.5
		// s (half the 1 s duration), of those served (these shapes sell
		// out within it: none may be late).
		if r.LateOrders < 0 || r.LateOrders > r.Orders || math.Abs(r.LateOrdersPerSec-float64(r.LateOrders)/(r.Seconds-0.5)) > 1e-6 {
			t.Errorf("%s: %d of %d orders served in the second half of %.2f s, at %.0f/s", r.Shape.Name, r.LateOrders, r.Orders, r.Seconds, r.LateOrdersPerSec)
		}
		if lo, hi := r.writeBounds[0], r.writeBounds[1]; sv.Writes < lo || sv.Writes > hi {
			t.Errorf("%s: the clients sent %d writes, etcd applied %d, outside the %d to %d the writes in flight at the edges allow", r.Shape.Name, cl.Writes, sv.Writes, lo, hi)
		}
	}
}

// A prepared shape (SaleShape.Prepare) runs only the strategies that can
// prepare (the clusters' strategy cannot: it is skipped), each process
// prepares every SKU before the window, and the row says how long that
// took. Run beside the same shape unprepared, over 1,000 SKUs and 2
// processes. The bench's processes hold their seller seats before the
// SKUs are created (coordinator.WithSellerSeat), so every SKU is born with
// each process's home named to it: an unprepared process's first order of
// a SKU is a born home's (segments' bornInto: no read, no takeover, one
// compare more than a peeked home's, the counter's value), and a prepared
// one peeked before the window. So the two rows compare alike but for
// that one compare on first orders (2.47 and 2.37 in a quiet run whose
// orders were a tenth first orders; before born homes a first order took
// its home over, ~1.7 compares more and a read). The test fails if the
// unprepared run's first orders take their homes over or peek them: its
// compares an order must not exceed the prepared run's by 1.35 (between
// the born compare's 1 and a takeover's 1.7) times the first orders'
// share of its orders, the share expected of uniform picks over 2,000
// (SKU, process) pairs (a loaded machine's run is nearly all first
// orders, 788 of 788 in a CI-like run; a quiet one's a tenth), and its
// reads an order must not exceed the prepared run's by half that share
// (a peek reads once). Keys an order are no measure here: the
// rebalancer's moves in the window, ~300 to 2,000 keys, swamp the first
// touches.
func TestRunSalePrepared(t *testing.T) {
	counter := &EtcdCounter{}
	cs := startEtcd(t, 2, grpc.WithChainUnaryInterceptor(counter.Interceptor()))
	const skus = 1000
	shapes := []SaleShape{{Name: "many", SKUs: skus, Stock: Plenty}, {Name: "many-prepared", SKUs: skus, Stock: Plenty, Prepare: true}}
	rows, err := RunSale(t.Context(), SaleConfig{Specs: []SaleSpec{StockctlSale(), StockctlClustersSale(2)}, Shapes: shapes, Buyers: 8, Processes: 2, Segments: 4,
		Duration: 2 * time.Second, Etcd: cs, Prefix: "/bench-sale-prepared/", Counter: counter,
		Server: &EtcdServerMetrics{Gatherer: prometheus.DefaultGatherer, Members: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var cmps, reads []float64
	var unprepared int64
	for _, r := range rows {
		if r.Strategy != nameStockctl {
			continue // the clusters' strategy ran the unprepared shape only
		}
		if !r.OK || r.Orders == 0 || r.Costs.ComparesPerOrder == nil || (r.PrepareSeconds > 0) != r.Shape.Prepare {
			t.Fatalf("%s: %+v", r.Shape.Name, r)
		}
		// Plenty of stock: the buyers buy to the end, the second half too.
		if r.LateOrders <= 0 || r.LateOrders >= r.Orders || r.LateOrdersPerSec <= 0 {
			t.Errorf("%s: %d of %d orders served in the second half, at %.0f/s", r.Shape.Name, r.LateOrders, r.Orders, r.LateOrdersPerSec)
		}
		read := float64(r.Etcd.Reads) / float64(r.Orders)
		cmps, reads = append(cmps, *r.Costs.ComparesPerOrder), append(reads, read)
		if !r.Shape.Prepare {
			unprepared = r.Orders
		}
		t.Logf("%s: %d orders, prepared in %.2f s, %.2f compares an order, %.3f reads an order, %d keys beyond one an order",
			r.Shape.Name, r.Orders, r.PrepareSeconds, *r.Costs.ComparesPerOrder, read, r.EtcdServer.Puts-r.Orders)
	}
	if len(rows) != 3 || len(cmps) != 2 {
		t.Fatalf("%d rows, %d of stockctl; want the clusters' strategy to skip the prepared shape", len(rows), len(cmps))
	}
	pairs := float64(2 * skus)
	firsts := pairs * (1 - math.Exp(-float64(unprepared)/pairs)) / float64(unprepared)
	if most := 1.35 * firsts; cmps[0]-cmps[1] >= most {
		t.Errorf("prepared, %.2f compares an order; unprepared %.2f (first orders ~%.0f %% of its %d): want fewer than %.2f more, as with born homes",
			cmps[1], cmps[0], 100*firsts, unprepared, most)
	}
	if most := 0.5 * firsts; reads[0]-reads[1] >= most {
		t.Errorf("prepared, %.3f reads an order; unprepared %.3f (first orders ~%.0f %% of its %d): want fewer than %.3f more, as with born homes",
			reads[1], reads[0], 100*firsts, unprepared, most)
	}
}

// The client's refused count: a write transaction whose compare fails is
// refused (its Else branch ran), one whose compare holds is not, one with
// a nested transaction refused is (the committer's groups), and reads and
// uncounted requests are neither. Nested transactions' compares and puts
// count as the outer one's.
func TestEtcdCounterRefused(t *testing.T) {
	counter := &EtcdCounter{}
	cs := startEtcd(t, 1, grpc.WithChainUnaryInterceptor(counter.Interceptor()))
	ctx, cli := t.Context(), cs[0]
	k := "/counter-test/k"
	txn := func(ver int64) {
		t.Helper()
		if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(k), "=", ver)).Then(clientv3.OpPut(k, "v")).Else(clientv3.OpGet(k)).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	txn(0) // holds: the key is new
	txn(0) // refused: version 1
	txn(1) // holds
	if _, err := cli.Get(ctx, k); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Txn(Uncounted(ctx)).If(clientv3.Compare(clientv3.Version(k), "=", 0)).Then(clientv3.OpPut(k, "v")).Commit(); err != nil {
		t.Fatal(err)
	}
	if got, want := counter.Snapshot(), (EtcdCounts{Reads: 1, Writes: 3, Puts: 3, Compares: 3, Refused: 1, Groups: 3, RefusedGroups: 1}); got != want {
		t.Fatalf("counted %+v, want %+v", got, want)
	}
	// Two nested groups: both hold (k2 is new, k at version 2), then one
	// holds and one is refused.
	k2 := "/counter-test/k2"
	nested := func(verK, verK2 int64) {
		t.Helper()
		if _, err := cli.Txn(ctx).Then(
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Version(k), "=", verK)}, []clientv3.Op{clientv3.OpPut(k, "v")}, []clientv3.Op{clientv3.OpGet(k)}),
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Version(k2), "=", verK2)}, []clientv3.Op{clientv3.OpPut(k2, "v")}, []clientv3.Op{clientv3.OpGet(k2)}),
		).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	nested(2, 0) // both hold
	nested(3, 0) // k2's refused
	if got, want := counter.Snapshot(), (EtcdCounts{Reads: 1, Writes: 5, Puts: 7, Compares: 7, Refused: 2, Groups: 7, RefusedGroups: 2}); got != want {
		t.Fatalf("with nested transactions: counted %+v, want %+v", got, want)
	}
}

// EtcdServerMetrics reads etcd's counters from a registry, divided by the
// members that each applied every write, and refuses a registry without
// them.
func TestEtcdServerMetricsMembers(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := (&EtcdServerMetrics{Gatherer: reg, Members: 1}).Snapshot(); err == nil {
		t.Fatal("a registry without etcd's counters read as counts")
	}
	counter := func(name string, v float64) {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name})
		c.Add(v)
		reg.MustRegister(c)
	}
	counter("etcd_mvcc_put_total", 30)
	counter("etcd_mvcc_delete_total", 6)
	counter("etcd_mvcc_txn_total", 9)
	counter("etcd_mvcc_range_total", 12)
	apply := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "etcd_server_apply_duration_seconds"}, []string{"version", "op", "success"})
	reg.MustRegister(apply)
	for _, op := range []string{"Txn", "Txn", "Put", "DeleteRange", "LeaseGrant", "Range"} {
		apply.WithLabelValues("v3", op, "true").Observe(0.001)
	}
	got, err := (&EtcdServerMetrics{Gatherer: reg, Members: 3}).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// 4 applied writes of 3 members: 1.33, rounded.
	if want := (EtcdServerCounts{Puts: 10, Deletes: 2, Writes: 1, MvccTxns: 3, Ranges: 4}); got != want {
		t.Fatalf("read %+v, want %+v", got, want)
	}
}

// Issue 27's targets on hand-made rows: each judged from the row it names,
// met on one side of its bound and not on the other.
func TestSaleTargetsCosts(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	row := func(strategy, shape string, skus int, perSec, keys, cmps, refused float64) SaleRow {
		r := SaleRow{Strategy: strategy, Shape: SaleShape{Name: shape, SKUs: skus, Stock: Plenty}, OrdersPerSec: perSec, OK: true}
		if strategy == nameStockctl {
			r.Costs = OrderCosts{KeysPerOrder: f(keys), ComparesPerOrder: f(cmps), RefusedCommits: f(refused)}
		}
		return r
	}
	limit := SaleRow{Strategy: LimitStrategy, Shape: LimitShape(DefaultLimitBatch), OrdersPerSec: 40_000, OK: true}
	status := func(rows []SaleRow) map[string]string {
		m := map[string]string{}
		for _, tg := range SaleTargets(rows) {
			m[tg.Name] = tg.Status + ": " + tg.Detail
		}
		return m
	}
	const (
		keys    = "etcd keys written per served order <= 1.1 on one SKU, <= 1.3 over many (etcd's count)"
		cmps    = "compares per served order <= 1.5"
		refused = "commits refused by their compares <= 2 %"
		large   = "orders/s over 10000 SKUs (many-10k) / one SKU >= 0.7"
		ofLimit = "orders/s on one SKU / the physical limit at 64 puts a commit >= 0.5"
		ofLuaOn = "orders/s at one / redis-lua's >= 0.8"
		ofLuaMa = "orders/s at many / redis-lua's >= 0.5"
	)
	good := status([]SaleRow{row(nameStockctl, "one", 1, 20_000, 1.05, 1.2, 0.01), row(nameRedisLua, "one", 1, 24_000, 0, 0, 0),
		row(nameStockctl, "many", 1000, 17_000, 1.25, 1.4, 0.02), row(nameRedisLua, "many", 1000, 30_000, 0, 0, 0),
		row(nameStockctl, "many-10k", 10000, 14_500, 1.3, 1.5, 0), limit})
	bad := status([]SaleRow{row(nameStockctl, "one", 1, 19_000, 1.15, 1.2, 0.01), row(nameRedisLua, "one", 1, 24_000, 0, 0, 0),
		row(nameStockctl, "many", 1000, 14_000, 1.25, 1.6, 0.01), row(nameRedisLua, "many", 1000, 30_000, 0, 0, 0),
		row(nameStockctl, "many-10k", 10000, 13_000, 1.31, 1.5, 0.03), limit})
	for _, name := range []string{keys, cmps, refused, large, ofLimit, ofLuaOn, ofLuaMa} {
		if !strings.HasPrefix(good[name], TargetMet+":") {
			t.Errorf("%q on good rows: %q", name, good[name])
		}
		if !strings.HasPrefix(bad[name], TargetNotMet+":") {
			t.Errorf("%q on bad rows: %q", name, bad[name])
		}
	}
	if !strings.Contains(bad[keys], "one 1.15 (<= 1.1)") || !strings.Contains(bad[refused], "many-10k 3.0 %") {
		t.Errorf("details: %q, %q", bad[keys], bad[refused])
	}
	// Without the rows a target needs, it is left out.
	if m := status([]SaleRow{row(nameStockctl, "storm", 1, 200, 0, 0, 0)}); m[keys] != "" {
		t.Errorf("keys judged without a plenty row: %q", m[keys])
	}
	if m := status([]SaleRow{row(nameStockctl, "one", 1, 20_000, 1, 1, 0)}); m[ofLimit] != "" || m[ofLuaOn] != "" {
		t.Errorf("judged without limit or redis rows: %v", m)
	}
}

// The cart shape on a real etcd: orders of 3 distinct SKUs of small stock,
// all or none, until they sell out: the row is OK (the books hold what the
// buyers were served, line by line, nothing oversold), refusals were
// checked true at their revision, and the keys written per line are the
// keys per order ÷ 3.
func TestRunSaleCart(t *testing.T) {
	counter := &EtcdCounter{}
	cs := startEtcd(t, 2, grpc.WithChainUnaryInterceptor(counter.Interceptor()))
	// 3 SKUs of 2 units: every cart takes one of each, so 2 carts sell
	// them out; each of the 8 buyers orders at least twice whatever the
	// machine's speed (a second was not enough to sell 40 carts out on a
	// busy machine, nor, under -race beside the suite, for a buyer's
	// second order), so at least 6 are refused twice, and a buyer's
	// refusals after its first are checked.
	shapes := []SaleShape{{Name: "cart", SKUs: 3, Stock: 2, Lines: 3}}
	rows, err := RunSale(t.Context(), SaleConfig{Specs: []SaleSpec{StockctlSale()}, Shapes: shapes, Buyers: 8, Processes: 2, Segments: 2,
		Duration: time.Second, MinOrders: 2, Etcd: cs, Prefix: "/bench-cart-test/", TruthSample: 1, Counter: counter,
		Server: &EtcdServerMetrics{Gatherer: prometheus.DefaultGatherer, Members: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows", len(rows))
	}
	r := rows[0]
	t.Logf("cart: %d orders, %d refusals, %d truth-checked, costs %+v", r.Orders, r.Refusals, r.TruthChecked, r.Costs)
	if !r.OK || r.Orders == 0 || r.Orders > 2 || r.Refusals == 0 || r.TruthChecked == 0 || r.Untrue != 0 {
		t.Fatalf("cart row: %+v", r)
	}
	c := r.Costs
	if c.KeysPerOrder == nil || c.KeysPerLine == nil || *c.KeysPerLine != *c.KeysPerOrder/3 {
		t.Fatalf("costs: %+v", c)
	}
}

// The cart-mix shape on a real etcd: half the orders carts of 3 SKUs,
// half single orders, over the same 4 SKUs until they sell out: the row is
// OK (the books hold what was served, line by line), refusals were checked
// true, and KEYS/LINE divides by the lines served: carts and single orders
// were both served, so the lines lie strictly between the orders and 3×.
func TestRunSaleCartMix(t *testing.T) {
	counter := &EtcdCounter{}
	cs := startEtcd(t, 2, grpc.WithChainUnaryInterceptor(counter.Interceptor()))
	shapes := []SaleShape{{Name: "cart-mix", SKUs: 4, Stock: 60, Lines: 3, CartShare: 0.5}}
	rows, err := RunSale(t.Context(), SaleConfig{Specs: []SaleSpec{StockctlSale()}, Shapes: shapes, Buyers: 8, Processes: 2, Segments: 2,
		Duration: time.Second, Etcd: cs, Prefix: "/bench-cartmix-test/", TruthSample: 1, Counter: counter,
		Server: &EtcdServerMetrics{Gatherer: prometheus.DefaultGatherer, Members: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows", len(rows))
	}
	r := rows[0]
	t.Logf("cart-mix: %d orders, %d lines, %d refusals, %d truth-checked, costs %+v", r.Orders, r.Lines, r.Refusals, r.TruthChecked, r.Costs)
	if !r.OK || r.Orders == 0 || r.Untrue != 0 {
		t.Fatalf("cart-mix row: %+v", r)
	}
	if r.Lines <= r.Orders || r.Lines >= 3*r.Orders {
		t.Fatalf("%d lines of %d orders served: want both carts and single orders", r.Lines, r.Orders)
	}
	c := r.Costs
	if c.KeysPerOrder == nil || c.KeysPerLine == nil || math.Abs(*c.KeysPerLine-*c.KeysPerOrder*float64(r.Orders)/float64(r.Lines)) > 1e-9 {
		t.Fatalf("costs: %+v", c)
	}
}
