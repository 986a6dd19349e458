package sale_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newCoordinators returns n coordinators, each on its own client (as if in
// its own process), on one embedded etcd.
func newCoordinators(t *testing.T, n int) []*coordinator.Coordinator {
	t.Helper()
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := make([]*coordinator.Coordinator, n)
	for i := range cs {
		c, err := coordinator.New(etcd.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs
}

func allocateOn(cs []*coordinator.Coordinator, sku string) sale.Buy {
	return func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error) {
		return cs[buyer%len(cs)].Allocate(ctx, sku, order, qty, routeKey)
	}
}

func createSKU(t *testing.T, c *coordinator.Coordinator, sku string, cfg coordinator.SKUConfig) {
	t.Helper()
	if _, err := c.CreateSKU(t.Context(), sku, cfg); err != nil {
		t.Fatal(err)
	}
}

// checkBooks cross-checks a run's figures against the coordinator's audit:
// what the run says it sold is exactly what the order records hold.
func checkBooks(t *testing.T, c *coordinator.Coordinator, sku string, res *sale.Result) *coordinator.AuditReport {
	t.Helper()
	a, err := c.Audit(t.Context(), sku)
	if err != nil {
		t.Fatal(err)
	}
	if !a.OK {
		t.Fatalf("audit: %v", a.Problems)
	}
	if a.Allocated != res.Units || a.Orders != res.Orders {
		t.Fatalf("audit says %d units in %d orders, the run says %d units in %d orders", a.Allocated, a.Orders, res.Units, res.Orders)
	}
	return a
}

func checkLatencies(t *testing.T, res *sale.Result) {
	t.Helper()
	if int64(len(res.Latencies)) != res.Orders {
		t.Fatalf("%d latency samples for %d orders", len(res.Latencies), res.Orders)
	}
	if res.Orders == 0 {
		return
	}
	if !(0 < res.P50 && res.P50 <= res.P90 && res.P90 <= res.P99 && res.P99 <= res.Max && res.Max <= res.Selling && res.Selling <= res.Elapsed) {
		t.Fatalf("latencies not ordered: p50 %v p90 %v p99 %v max %v selling %v elapsed %v",
			res.P50, res.P90, res.P99, res.Max, res.Selling, res.Elapsed)
	}
	if want := float64(res.Orders) / res.Selling.Seconds(); res.OrdersPerSec != want {
		t.Fatalf("orders/s %v, want %v", res.OrdersPerSec, want)
	}
	if res.P50 != sale.Percentile(res.Latencies, 50) || res.Max != res.Latencies[len(res.Latencies)-1] {
		t.Fatalf("percentiles do not match the samples")
	}
}

// Invariant: a sale runs until sold out, and sells exactly the total: the
// units the buyers were served equal the total and the audit's allocated
// stock; nothing is oversold, nothing left.
func TestSellsOutExactly(t *testing.T) {
	cs := newCoordinators(t, 3)
	const total = 120
	createSKU(t, cs[0], "tee", coordinator.SKUConfig{Total: total, Segments: 4, InitialFill: 40, LowWatermark: 3, RefillBatch: 5})

	r, err := rebalance.New(cs[2], rebalance.Config{Identity: "test", IdleAfter: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	var rwg sync.WaitGroup
	rwg.Go(func() { _ = r.Run(rctx) })
	defer func() { stop(); rwg.Wait() }()

	var progress []sale.Progress
	res, err := sale.Run(t.Context(), sale.Config{
		Buyers: 12, Buy: allocateOn(cs, "tee"), MinQty: 1, MaxQty: 3,
		MaxDuration: time.Minute, Seed: 7, AttemptTimeout: 3 * time.Second,
		ProgressInterval: 20 * time.Millisecond,
		Progress:         func(p sale.Progress) { progress = append(progress, p) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *res)
	if res.Stop != sale.StopSoldOut || !res.SoldOut {
		t.Fatalf("stopped for %q (sold out %v), want sold out", res.Stop, res.SoldOut)
	}
	if res.Units != total {
		t.Fatalf("sold %d units of %d", res.Units, total)
	}
	if res.Unresolved != 0 {
		t.Fatalf("%d errors, %d unresolved; first: %v", res.Errors, res.Unresolved, res.FirstError)
	}
	if res.Errors != 0 {
		// With no faults injected, no attempt may fail or hang past
		// AttemptTimeout. (A lock wait that missed its predecessor's
		// delete, when the same session re-queued at once under the same
		// key name, once made attempts hang here.)
		t.Fatalf("%d attempts failed with no fault injected; first: %v", res.Errors, res.FirstError)
	}
	// Every buyer stops on a refusal of one unit, so at least one refusal each.
	if res.Refusals < 12 {
		t.Fatalf("%d refusals, want at least one per buyer", res.Refusals)
	}
	if res.MinPerBuyer > res.MaxPerBuyer || res.MaxPerBuyer > res.Orders {
		t.Fatalf("per buyer %d..%d of %d orders", res.MinPerBuyer, res.MaxPerBuyer, res.Orders)
	}
	checkLatencies(t, res)
	a := checkBooks(t, cs[0], "tee", res)
	if a.Pool != 0 || a.Segments != 0 {
		t.Fatalf("sold out but pool %d, segments %d", a.Pool, a.Segments)
	}
	if len(progress) == 0 || !progress[len(progress)-1].Done || progress[len(progress)-1].Units != total {
		t.Fatalf("last progress %+v, want Done with %d units", progress[len(progress)-1], total)
	}
	if len(progress) < 2 {
		t.Fatalf("%d progress reports: want one as the run starts and one at its end, however short the run", len(progress))
	}
	for i, p := range progress[:len(progress)-1] {
		if p.Done {
			t.Fatalf("progress %d of %d is Done", i, len(progress))
		}
	}
}

// Invariant: MaxOrders bounds the order IDs placed; what was sold still
// matches the books.
func TestMaxOrders(t *testing.T) {
	cs := newCoordinators(t, 2)
	createSKU(t, cs[0], "mug", coordinator.SKUConfig{Total: 10000, Segments: 4, InitialFill: 10000})
	res, err := sale.Run(t.Context(), sale.Config{
		Buyers: 5, Buy: allocateOn(cs, "mug"), MinQty: 1, MaxQty: 2, MaxOrders: 23,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stop != sale.StopMaxOrders || res.SoldOut {
		t.Fatalf("stopped for %q, want max orders", res.Stop)
	}
	if res.Orders != 23 {
		t.Fatalf("%d orders, want 23", res.Orders)
	}
	checkLatencies(t, res)
	checkBooks(t, cs[0], "mug", res)
}

// Invariant: an order whose reply is lost is retried under its order ID and
// counted once: the retry replays the first commit.
func TestLostRepliesCountedOnce(t *testing.T) {
	cs := newCoordinators(t, 1)
	createSKU(t, cs[0], "cap", coordinator.SKUConfig{Total: 40, Segments: 2, InitialFill: 40})
	var lost atomic.Int64
	var seen sync.Map
	buy := func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error) {
		a, err := cs[0].Allocate(ctx, "cap", order, qty, routeKey)
		if _, again := seen.LoadOrStore(order, true); !again && err == nil {
			lost.Add(1)
			return nil, errors.New("reply lost")
		}
		return a, err
	}
	res, err := sale.Run(t.Context(), sale.Config{Buyers: 4, Buy: buy, MinQty: 1, MaxQty: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Units != 40 || res.Replayed != lost.Load() || res.Errors != lost.Load() || res.Unresolved != 0 {
		t.Fatalf("units %d, replayed %d, errors %d, unresolved %d; %d replies were lost",
			res.Units, res.Replayed, res.Errors, res.Unresolved, lost.Load())
	}
	checkBooks(t, cs[0], "cap", res)
}

// fakeBuy serves every order after d, without etcd.
func fakeBuy(d time.Duration) sale.Buy {
	return func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error) {
		select {
		case <-time.After(d):
			return &coordinator.Allocation{Order: order, Qty: qty}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Invariant: MaxDuration bounds a sale that never sells out.
func TestMaxDuration(t *testing.T) {
	start := time.Now()
	res, err := sale.Run(t.Context(), sale.Config{Buyers: 3, Buy: fakeBuy(time.Millisecond), MinQty: 1, MaxQty: 5,
		MaxDuration: 150 * time.Millisecond, StopGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Unbounded, the run would go on for DefaultMaxDuration (5 min).
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("run took %v", took)
	}
	if res.Stop != sale.StopMaxDuration || res.Orders == 0 || res.Unresolved != 0 {
		t.Fatalf("stop %q, %d orders, %d unresolved", res.Stop, res.Orders, res.Unresolved)
	}
	checkLatencies(t, res)
}

// Invariant: orders that outlive the stop grace are cut off and counted as
// unresolved, and the run still ends in bounded time.
func TestStopGraceCutsSlowOrders(t *testing.T) {
	start := time.Now()
	res, err := sale.Run(t.Context(), sale.Config{Buyers: 2, Buy: fakeBuy(time.Hour), MinQty: 1, MaxQty: 1,
		MaxDuration: 50 * time.Millisecond, StopGrace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("run took %v", took)
	}
	if res.Stop != sale.StopMaxDuration || res.Orders != 0 || res.Unresolved != 2 || res.Errors != 0 {
		t.Fatalf("stop %q, %d orders, %d unresolved, %d errors", res.Stop, res.Orders, res.Unresolved, res.Errors)
	}
}

// Invariant: an attempt that hangs is cut off after AttemptTimeout,
// counted as an error and retried under the same order ID.
func TestAttemptTimeout(t *testing.T) {
	var calls sync.Map
	slowOnce := func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error) {
		if _, again := calls.LoadOrStore(order, true); !again {
			<-ctx.Done() // the first attempt hangs
			return nil, ctx.Err()
		}
		return &coordinator.Allocation{Order: order, Qty: qty}, nil
	}
	res, err := sale.Run(t.Context(), sale.Config{Buyers: 2, Buy: slowOnce, MinQty: 1, MaxQty: 1, MaxOrders: 4,
		AttemptTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Orders != 4 || res.Errors != 4 || res.Unresolved != 0 || res.FirstError == nil ||
		!strings.Contains(res.FirstError.Error(), "took longer than 50ms") {
		t.Fatalf("orders %d, errors %d, unresolved %d, first error %v", res.Orders, res.Errors, res.Unresolved, res.FirstError)
	}
}

// Invariant: persistent errors stop the run at MaxErrors, with the first
// error kept, and each order is tried MaxAttempts times.
func TestErrorsStopTheRun(t *testing.T) {
	var calls atomic.Int64
	boom := func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error) {
		calls.Add(1)
		return nil, fmt.Errorf("etcd unreachable (order %s)", order)
	}
	res, err := sale.Run(t.Context(), sale.Config{Buyers: 2, Buy: boom, MinQty: 1, MaxQty: 1, MaxErrors: 9, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stop != sale.StopMaxErrors || res.FirstError == nil || res.Orders != 0 {
		t.Fatalf("stop %q, first error %v, %d orders", res.Stop, res.FirstError, res.Orders)
	}
	if res.Errors != calls.Load() || res.Errors < 9 || res.Unresolved == 0 {
		t.Fatalf("%d errors for %d calls, %d unresolved", res.Errors, calls.Load(), res.Unresolved)
	}
}

// Invariant: when the caller's ctx ends, Run returns its cause with the
// result so far.
func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancelCause(t.Context())
	time.AfterFunc(100*time.Millisecond, func() { cancel(errors.New("operator pressed ^C")) })
	res, err := sale.Run(ctx, sale.Config{Buyers: 2, Buy: fakeBuy(time.Millisecond), MinQty: 1, MaxQty: 1})
	if err == nil || err.Error() != "operator pressed ^C" {
		t.Fatalf("err %v, want the cancel cause", err)
	}
	if res == nil || res.Stop != sale.StopCancelled || res.Orders == 0 {
		t.Fatalf("result %+v", res)
	}
}

func TestInvalidConfig(t *testing.T) {
	ok := sale.Config{Buyers: 1, Buy: fakeBuy(0), MinQty: 1, MaxQty: 1}
	for name, mutate := range map[string]func(*sale.Config){
		"no buyers":      func(c *sale.Config) { c.Buyers = 0 },
		"no buy":         func(c *sale.Config) { c.Buy = nil },
		"zero qty":       func(c *sale.Config) { c.MinQty = 0 },
		"min above max":  func(c *sale.Config) { c.MinQty, c.MaxQty = 3, 2 },
		"negative dur":   func(c *sale.Config) { c.MaxDuration = -time.Second },
		"negative max":   func(c *sale.Config) { c.MaxOrders = -1 },
		"bad order pfx":  func(c *sale.Config) { c.OrderPrefix = "has space" },
		"long order pfx": func(c *sale.Config) { c.OrderPrefix = string(make([]byte, 120)) },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := ok
			mutate(&cfg)
			res, err := sale.Run(t.Context(), cfg)
			if !errors.Is(err, sale.ErrInvalidConfig) || res != nil {
				t.Fatalf("Run = %v, %v; want ErrInvalidConfig", res, err)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n)*time.Millisecond)
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		name    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"median of four", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of 100", hundred, 99, 99 * time.Millisecond},
		{"p50 of 100", hundred, 50, 50 * time.Millisecond},
		{"p100", hundred, 100, 100 * time.Millisecond},
		{"tiny p", hundred, 0.001, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sale.Percentile(tc.samples, tc.p); got != tc.want {
				t.Fatalf("Percentile(p%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}
