package coordinator_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// BenchmarkLifecycle: what reservations and per-user limits cost, on one hot
// SKU of 20 segments, 200 goroutines across 4 coordinators, etcd with fsync
// on, in one run:
//
//	allocate:               plain Allocate (the baseline)
//	allocate-limit:         Allocate on a SKU with a per-user limit; every
//	                        order for a distinct buyer (the common case: a
//	                        buyer's counter key is new to the group commit)
//	allocate-limit-hot:     the same with 20 buyers only, each ordering again
//	                        and again (the limit set high enough never to
//	                        refuse): their counters are contended across the
//	                        4 processes; orders that give up after too many
//	                        failed compares (nothing deducted, retryable) are
//	                        counted as contended-share, not as served
//	reserve-confirm:        Reserve, then Confirm (two commits per order)
//	reserve-confirm-limit:  the same on the limited SKU
//
// b.N is the number of orders of each variant. It prints each variant's
// orders/s and latency, and the cost per order of the limit relative to the
// baseline.
//
// Run: go test -run x -bench BenchmarkLifecycle -benchtime 4000x ./coordinator
func BenchmarkLifecycle(b *testing.B) {
	etcd := etcdtest.NewSingle(b)
	cs := make([]*coordinator.Coordinator, 4)
	for i := range cs {
		c, err := coordinator.New(etcd.Client(b))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	variants := []struct {
		name    string
		limit   int64
		buyers  int // distinct buyers; 0: one per order
		reserve bool
	}{
		{"allocate", 0, 0, false},
		{"allocate-limit", 5, 0, false},
		{"allocate-limit-hot", segments.MaxQty, 20, false},
		{"reserve-confirm", 0, 0, true},
		{"reserve-confirm-limit", 5, 0, true},
	}
	rates := map[string]float64{}
	for vi, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			sku := fmt.Sprintf("life-%d-%d", vi, b.N)
			total := int64(2 * b.N)
			if _, err := cs[0].CreateSKU(context.Background(), sku, coordinator.SKUConfig{Total: total, Segments: 20,
				InitialFill: total, PerUserLimit: v.limit}); err != nil {
				b.Fatal(err)
			}
			var next, served, retryable atomic.Int64
			var mu sync.Mutex
			var lat []float64
			ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
			defer cancel()
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for g := range 200 {
				wg.Go(func() {
					c := cs[g%len(cs)]
					var my []float64
					defer func() { mu.Lock(); lat = append(lat, my...); mu.Unlock() }()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						order := fmt.Sprintf("%s-%d", sku, i)
						buyer := fmt.Sprintf("user-%d", i)
						if v.buyers > 0 {
							buyer = fmt.Sprintf("user-%d", i%int64(v.buyers))
						}
						var opts []coordinator.OrderOption
						if v.limit > 0 {
							opts = append(opts, coordinator.WithBuyer(buyer))
						}
						t0 := time.Now()
						var err error
						if v.reserve {
							if _, err = c.Reserve(ctx, sku, order, 1, buyer, time.Hour, opts...); err == nil {
								_, err = c.Confirm(ctx, sku, order)
							}
						} else {
							_, err = c.Allocate(ctx, sku, order, 1, buyer, opts...)
						}
						if err != nil && v.buyers > 0 && strings.Contains(err.Error(), "kept failing its compares") {
							// A hot buyer's counter, written by four processes
							// at once: the order deducted nothing, and a
							// retry would place it.
							retryable.Add(1)
							continue
						}
						if err != nil {
							b.Error(err)
							next.Store(int64(b.N))
							return
						}
						served.Add(1)
						my = append(my, ms(time.Since(t0)))
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			rate := float64(served.Load()) / elapsed.Seconds()
			rates[v.name] = rate
			b.ReportMetric(rate, "orders/s")
			if v.buyers > 0 {
				b.ReportMetric(float64(retryable.Load())/float64(b.N), "contended-share")
			}
			b.ReportMetric(pct(lat, 50), "p50-ms")
			b.ReportMetric(pct(lat, 99), "p99-ms")
			if r, err := cs[0].Audit(context.Background(), sku); err != nil || !r.OK || r.Allocated != served.Load() {
				b.Fatalf("audit after the run: %+v %v", r, err)
			}
		})
	}
	base := rates["allocate"]
	if base > 0 {
		for _, v := range variants[1:] {
			if r := rates[v.name]; r > 0 {
				fmt.Printf("%-22s %7.0f orders/s vs allocate %7.0f/s: %+6.0f µs per order of capacity (%.2fx)\n",
					v.name, r, base, 1e6/r-1e6/base, r/base)
			}
		}
	}
}
