package coordinator_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// BenchmarkIdleSKUs: what a SKU that was ordered once and is now idle costs
// a process. b.N SKUs of 20 segments are created; one coordinator orders 1
// unit of each (a cold SKU's order is a direct one: a seller with its
// caches, and no segment lock; a SKU that grew hot would hold segments
// until TenureIdle, shortened here to 200 ms); then the SKUs stay idle until
// the coordinator forgot their sellers (twice TenureIdle after their last
// use). Reports heap bytes and goroutines per idle SKU, measured after a
// GC against the same coordinator before its first order; fixed costs (the
// client's first calls) are spread over the SKUs, so run it with many. etcd
// runs in a process of its own.
//
// Run: go test -run x -bench BenchmarkIdleSKUs -benchtime 10000x ./coordinator
func BenchmarkIdleSKUs(b *testing.B) {
	// etcd in a process of its own (Debian's etcd-server, installed when
	// missing): an embedded one's own memory would be counted as the
	// coordinator's.
	etcd := etcdtest.NewExternal(b, etcdtest.WithNoFsync())
	admin, err := coordinator.New(etcd.Client(b))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	c, err := coordinator.New(etcd.Client(b), coordinator.WithTenure(200*time.Millisecond, coordinator.DefaultTenureMaxHold))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	n := b.N
	sku := func(i int) string { return fmt.Sprintf("idle-%d-%d", n, i) }
	parallel(b, n, func(i int) error {
		_, err := admin.CreateSKU(ctx, sku(i), coordinator.SKUConfig{Total: 100, Segments: 20, InitialFill: 100})
		return err
	})
	heap0, g0 := heapAndGoroutines()
	b.ResetTimer()
	parallel(b, n, func(i int) error {
		_, err := c.Allocate(ctx, sku(i), fmt.Sprintf("o-%d-%d", n, i), 1, "")
		return err
	})
	b.StopTimer()
	// Idle: the tenures end after 200 ms, the sellers are forgotten 400 ms
	// after their last use (checked every 100 ms). Wait for that, bounded.
	deadline := time.Now().Add(time.Minute)
	heap2, g2 := heapAndGoroutines()
	for time.Now().Before(deadline) && float64(heap2-heap0)/float64(n) > 2048 {
		time.Sleep(200 * time.Millisecond)
		heap2, g2 = heapAndGoroutines()
	}
	b.ReportMetric(float64(heap2-heap0)/float64(n), "idle-B/SKU")
	b.ReportMetric(float64(g2-g0)/float64(n), "idle-goroutines/SKU")
}

// heapAndGoroutines is the live heap after a GC, and the goroutine count.
func heapAndGoroutines() (int64, int) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), runtime.NumGoroutine()
}

// parallel calls f for 0..n-1, 16 at a time, failing b on the first error.
func parallel(b *testing.B, n int, f func(i int) error) {
	work := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if err := f(i); err != nil {
					once.Do(func() { b.Error(err) })
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}
