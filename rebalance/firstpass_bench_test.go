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
// middle of a many-SKU sale may find them). b.N is the number of SKUs
// (createDrySKUs: 4 segments each, every one below the watermark, the rest
// in the pool); etcd with fsync on. It reports SKUs refilled a second, from
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
	names := createDrySKUs(b, c, fmt.Sprintf("fp-%d-", b.N), b.N)
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
	for _, sku := range names[:min(b.N, 20)] {
		if a, err := c.Audit(ctx, sku); err != nil || !a.OK {
			b.Fatalf("audit: %+v %v", a, err)
		}
	}
}
