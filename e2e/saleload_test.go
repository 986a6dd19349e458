package e2e

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
	"github.com/stockctl/stockctl/coordinator"
)

// faultGate holds buyers at given fractions of a sale's stock until the
// test has injected its fault there, so that every fault lands mid-sale
// however fast or slow the machine sells. A buyer held at the gate waits
// only for the test to act; the fault itself then happens under load.
type faultGate struct {
	thresholds []int64
	opened     []chan struct{}
	units      atomic.Int64
}

func newFaultGate(total int64, fractions ...float64) *faultGate {
	g := &faultGate{}
	for _, f := range fractions {
		g.thresholds = append(g.thresholds, int64(f*float64(total)))
		g.opened = append(g.opened, make(chan struct{}))
	}
	return g
}

// wait holds a buyer at every threshold reached but not yet opened.
func (g *faultGate) wait(ctx context.Context) error {
	u := g.units.Load()
	for i, th := range g.thresholds {
		if u < th {
			return nil
		}
		select {
		case <-g.opened[i]:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// reached reports whether the sale has sold up to threshold i.
func (g *faultGate) reached(i int) bool { return g.units.Load() >= g.thresholds[i] }

// open lets buyers past threshold i.
func (g *faultGate) open(i int) { close(g.opened[i]) }

// gatedBuy places orders through cs in turn, held by g.
func gatedBuy(g *faultGate, sku string, cs []*coordinator.Coordinator) sale.Buy {
	return func(ctx context.Context, buyer int, order string, qty int64, routeKey string) (*coordinator.Allocation, error) {
		if err := g.wait(ctx); err != nil {
			return nil, err
		}
		a, err := cs[buyer%len(cs)].Allocate(ctx, sku, order, qty, routeKey)
		if err == nil {
			g.units.Add(a.Qty)
		}
		return a, err
	}
}

// startSale runs a sale in the background; the returned function waits for
// it (the sale is cancelled at cleanup if the test ends first).
func startSale(t testing.TB, cfg sale.Config) func() (*sale.Result, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	type outcome struct {
		res *sale.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := sale.Run(ctx, cfg)
		done <- outcome{res, err}
	}()
	var got *outcome
	wait := func() (*sale.Result, error) {
		if got == nil {
			o := <-done
			got = &o
		}
		return got.res, got.err
	}
	t.Cleanup(func() {
		cancel()
		_, _ = wait()
	})
	return wait
}

// saleConfig is a sale of buyers that survives faults: failed attempts are
// retried under their order ID, without a bound on the errors, and the run
// is bounded in time instead.
func saleConfig(buyers int, buy sale.Buy) sale.Config {
	return sale.Config{
		Buyers:         buyers,
		Buy:            buy,
		MinQty:         1,
		MaxQty:         3,
		MaxDuration:    90 * time.Second,
		MaxErrors:      -1,
		MaxAttempts:    20,
		AttemptTimeout: 10 * time.Second,
	}
}

// checkSoldOut asserts what every sale here must end with: every buyer was
// told the SKU is sold out, what buyers were sold never exceeds the stock,
// the active orders in etcd add up to exactly the total (no oversell, no
// stock lost), and the books balance.
func checkSoldOut(t testing.TB, c *coordinator.Coordinator, sku string, total int64, res *sale.Result) *coordinator.AuditReport {
	t.Helper()
	rep := mustAudit(t, c, sku)
	t.Logf("sale %s: stop %q, %d orders / %d units acknowledged, %d replayed after a failed attempt, %d unresolved, %d errors (first: %v), %v; audit: allocated %d of %d, pool %d, segments %d",
		sku, res.Stop, res.Orders, res.Units, res.Replayed, res.Unresolved, res.Errors, res.FirstError, res.Elapsed.Round(time.Millisecond),
		rep.Allocated, rep.Total, rep.Pool, rep.Segments)
	if res.Units > total || rep.Allocated > total {
		t.Fatalf("oversell: %d units acknowledged, %d allocated in etcd, of %d", res.Units, rep.Allocated, total)
	}
	if res.Stop != sale.StopSoldOut || !res.SoldOut {
		t.Fatalf("the sale did not complete: it stopped with %q", res.Stop)
	}
	if rep.Allocated != total || rep.Pool != 0 || rep.Segments != 0 {
		t.Fatalf("sold out, but allocated %d of %d with %d in the pool and %d in segments", rep.Allocated, total, rep.Pool, rep.Segments)
	}
	if res.Unresolved == 0 && res.Units != total {
		t.Fatalf("every order resolved, but buyers were sold %d units of %d", res.Units, total)
	}
	return rep
}
