package rebalance_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// BenchmarkFirstPass: how long a newly elected rebalancer takes to refill
// every SKU of a sale whose segments are all below their watermark (as
// they start in `bench --sale`'s shapes, and as a leader elected in the
// middle of a many-SKU sale may find them). b.N is the number
// of SKUs (as createDrySKUs makes them: 4 segments each, every one below
// the watermark, the rest in the pool); etcd with fsync on. It reports SKUs refilled a second, from
// Run to the last SKU's first refill.
//
// Run: go test -run x -bench BenchmarkFirstPass -benchtime 2000x ./rebalance
func BenchmarkFirstPass(b *testing.B) {
	etcd := etcdtest.NewSingle(b)
	c, err := coordinator.New(etcd.Client(b))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("fp-%d-", b.N)
	var cg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		cg.Go(func() {
			for i := w; i < b.N; i += 32 {
				if _, err := c.CreateSKU(ctx, fmt.Sprintf("%s%d", prefix, i), coordinator.SKUConfig{Total: dryTotal, Segments: 4,
					InitialFill: dryFill, LowWatermark: 5, RefillBatch: 10}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	cg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	refilled := map[string]bool{}
	all := make(chan struct{})
	r, err := rebalance.New(c, rebalance.Config{Identity: "bench", OnMove: func(m rebalance.Move) {
		if m.Kind != rebalance.Refill {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !refilled[m.SKU] {
			refilled[m.SKU] = true
			if len(refilled) == b.N {
				close(all)
			}
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(rctx) })
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		b.Fatalf("only %d of %d SKUs refilled", len(refilled), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	stop()
	wg.Wait()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "skus/s")
	for i := range min(b.N, 20) {
		if a, err := c.Audit(ctx, fmt.Sprintf("%s%d", prefix, i)); err != nil || !a.OK {
			b.Fatalf("audit: %+v %v", a, err)
		}
	}
}
