package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// errStepPanic is what the panicking steps of these tests panic with.
var errStepPanic = errors.New("step panicked")

// allocateRecovering is AllocateFunc as a service's recovering middleware
// sees it: a panic of the step comes back as the recovered value.
func allocateRecovering(ctx context.Context, c *coordinator.Coordinator, sku, order string, qty int64, step coordinator.Step) (a *coordinator.Allocation, recovered any, err error) {
	defer func() { recovered = recover() }()
	a, err = c.AllocateFunc(ctx, sku, order, qty, "", step)
	return a, nil, err
}

func panicking(context.Context) error { panic(errStepPanic) }
func fine(context.Context) error      { return nil }

// Invariant (issue 19, item 4): a business step that panics gets its panic
// back in AllocateFunc's caller, deducts nothing, and leaves nothing
// behind: the slot it ran in, the units reserved for it and the FIFO are
// free for the next orders, which are all served. Both places a step runs
// are covered: a held segment's slot, and places locked by a gather (no
// single place holds the quantity).
func TestStepPanicLeavesNothingBehind(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   coordinator.SKUConfig
		qty   int64
		after int // orders of qty served after the panic
		parts int // places each of them takes from
	}{
		{"slot", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}, 1, 10, 1},
		{"gather", coordinator.SKUConfig{Total: 2, Segments: 2, InitialFill: 2}, 2, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
			c := newCoordinators(t, etcd, 1)[0]
			// Only a hang can reach this bound: each order below takes
			// milliseconds when nothing is wedged.
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			mustCreate(t, c, "p", tc.cfg)
			for i := range 3 {
				_, rec, err := allocateRecovering(ctx, c, "p", fmt.Sprintf("boom-%d", i), tc.qty, panicking)
				if rec != errStepPanic {
					t.Fatalf("AllocateFunc with a panicking step: recovered %v (err %v), want the step's panic", rec, err)
				}
			}
			for i := range tc.after {
				a, err := c.AllocateFunc(ctx, "p", fmt.Sprintf("ok-%d", i), tc.qty, "", fine)
				if err != nil {
					t.Fatalf("order %d after a panicking step: %v", i, err)
				}
				if len(a.Parts) != tc.parts {
					t.Fatalf("order %d took from %v, want %d places: the test does not run the path it names", i, a.Parts, tc.parts)
				}
			}
			rep := mustAudit(t, c, "p")
			if rep.Allocated != tc.cfg.Total || rep.Orders != int64(tc.after) {
				t.Fatalf("audit: %d units in %d orders, want %d in %d", rep.Allocated, rep.Orders, tc.cfg.Total, tc.after)
			}
			for i := range 3 {
				if _, err := c.Release(ctx, "p", fmt.Sprintf("boom-%d", i)); !errors.Is(err, coordinator.ErrOrderNotFound) {
					t.Fatalf("the panicking order boom-%d: %v, want never applied", i, err)
				}
			}
		})
	}
}

// Invariant (issue 19, item 4), under concurrency: 16 buyers on 2
// coordinators run 90 step orders of one unit against 60 units in 4
// segments, and every third step panics. Every panic reaches its caller
// (or its order is refused, sold out before its step ran), the 60 other
// orders are all served (nothing wedged, no unit lost to a
// panicked reservation), no panicked order is recorded, and the books
// balance.
func TestConcurrentStepPanics(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	const total = 60
	mustCreate(t, cs[0], "cp", coordinator.SKUConfig{Total: total, Segments: 4, InitialFill: total})
	var next, served, panics, refused atomic.Int64
	var wg sync.WaitGroup
	for b := range 16 {
		c := cs[b%len(cs)]
		wg.Go(func() {
			for {
				n := next.Add(1)
				if n > total*3/2 {
					return
				}
				order := fmt.Sprintf("o%d", n)
				step := fine
				if n%3 == 0 {
					step = panicking
				}
				_, rec, err := allocateRecovering(ctx, c, "cp", order, 1, step)
				switch {
				case n%3 == 0 && rec == errStepPanic:
					panics.Add(1)
				case n%3 == 0 && errors.Is(err, coordinator.ErrInsufficientStock):
					refused.Add(1) // sold out before its step could run
				case n%3 != 0 && rec == nil && err == nil:
					served.Add(1)
				default:
					t.Errorf("order %s: err %v, recovered %v", order, err, rec)
				}
			}
		})
	}
	wg.Wait()
	if served.Load() != total || panics.Load()+refused.Load() != total/2 || panics.Load() == 0 {
		t.Fatalf("%d orders served, %d panics, %d refused; want %d served, %d panics or refusals", served.Load(), panics.Load(), refused.Load(), total, total/2)
	}
	if rep := mustAudit(t, cs[0], "cp"); rep.Allocated != total || rep.Orders != total {
		t.Fatalf("audit: %d units in %d orders, want %d in %d", rep.Allocated, rep.Orders, total, total)
	}
}
