package rebalance_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// BenchmarkRefillSale: a hot SKU in 20 segments, 200 buyers over 4
// coordinators, each order holding its segment's lock through a 20 ms
// business step (ideal 1000 orders/s), etcd with fsync on. In one run:
//
//	rebalancer: 10% of the stock starts in the segments, the rest in the
//	            pool; a rebalancer on one of the buyers' coordinators refills
//	            segments below the watermark (20) with batches of 25.
//	pre-split:  all the stock starts in the segments; no rebalancer.
//
// b.N is the number of orders; the SKU holds twice as many units, so the
// run measures a sale in full swing, not its sell-out.
//
// Refill latency is measured by an observer outside the rebalancer
// (bench.RefillObserver, the one stockctl bench uses): one watch on the
// SKU's counters, which timestamps the revision that takes a segment's stock
// (counter + inbox) below the watermark and the one that raises its inbox
// afterwards, be it the rebalancer's refill or a seller's pull from the
// pool. Both arrive on the same watch stream, so its delivery delay cancels
// out. The rebalancer's own figure (Move.Latency, from its seeing the
// crossing to its commit) is reported beside it.
//
// Run: go test -run x -bench BenchmarkRefillSale -benchtime 6000x ./rebalance
func BenchmarkRefillSale(b *testing.B) {
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
	const segs, watermark, batch, buyers = 20, 20, 25, 200
	const step = 20 * time.Millisecond
	ideal := float64(segs) / step.Seconds()
	rates := map[string]float64{}
	for vi, name := range []string{"rebalancer", "pre-split"} {
		b.Run(name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			sku := fmt.Sprintf("refill-%d-%d", vi, b.N)
			total := int64(2 * b.N)
			fill := total
			if name == "rebalancer" {
				fill = total / 10
			}
			if _, err := cs[0].CreateSKU(ctx, sku, coordinator.SKUConfig{Total: total, Segments: segs,
				InitialFill: fill, LowWatermark: watermark, RefillBatch: batch}); err != nil {
				b.Fatal(err)
			}
			var obs *bench.RefillObserver
			var self []float64
			var selfMu sync.Mutex
			var rwg sync.WaitGroup
			rctx, stopRebalancer := context.WithCancel(ctx)
			defer func() { stopRebalancer(); rwg.Wait() }()
			if name == "rebalancer" {
				var err error
				if obs, err = bench.ObserveRefills(ctx, etcd.Client(b), coordinator.DefaultPrefix, sku, segs, watermark); err != nil {
					b.Fatal(err)
				}
				defer obs.Stop()
				r, err := rebalance.New(cs[0], rebalance.Config{Identity: "bench", OnMove: func(m rebalance.Move) {
					if m.Kind == rebalance.Refill && m.SKU == sku && m.Latency > 0 {
						selfMu.Lock()
						self = append(self, ms(m.Latency))
						selfMu.Unlock()
					}
				}})
				if err != nil {
					b.Fatal(err)
				}
				rwg.Go(func() { _ = r.Run(rctx) })
			}

			elapsed := sell(b, ctx, cs, sku, buyers, step)
			rate := float64(b.N) / elapsed.Seconds()
			rates[name] = rate
			b.ReportMetric(rate, "orders/s")
			b.ReportMetric(rate/ideal, "of-ideal")
			if obs != nil {
				seen := obs.Stop()
				if seen.Err != nil {
					b.Fatalf("refill observer: %v", seen.Err)
				}
				lat := make([]float64, len(seen.Latencies))
				for i, d := range seen.Latencies {
					lat[i] = ms(d)
				}
				if len(lat) == 0 {
					if b.N < 1000 {
						return // the probe run: too short to drain a segment
					}
					b.Fatalf("no refill observed in a sale of %d orders", b.N)
				}
				b.ReportMetric(float64(len(lat)), "refills")
				b.ReportMetric(pct(lat, 50), "refill-p50-ms")
				b.ReportMetric(pct(lat, 99), "refill-p99-ms")
				b.ReportMetric(slices.Max(lat), "refill-max-ms")
				selfMu.Lock()
				b.ReportMetric(pct(self, 99), "self-p99-ms")
				selfMu.Unlock()
				if seen.Pending > 0 {
					b.Logf("%d segments still below the watermark, not yet refilled, when the sale stopped", seen.Pending)
				}
			}
			stopRebalancer()
			rwg.Wait()
			r, err := cs[0].Audit(ctx, sku)
			if err != nil || !r.OK || r.Allocated != int64(b.N) {
				b.Fatalf("audit after the run: %+v %v", r, err)
			}
		})
	}
	if rb, pre := rates["rebalancer"], rates["pre-split"]; rb > 0 && pre > 0 {
		fmt.Printf("20 segments, 20 ms step: with the rebalancer %.0f orders/s (%.2f of ideal), pre-split %.0f orders/s (%.2f of ideal): ratio %.2f\n",
			rb, rb/ideal, pre, pre/ideal, rb/pre)
	}
}

// sell has buyers goroutines over cs place b.N one-unit orders with
// AllocateFunc and a business step of step, and returns the elapsed time.
func sell(b *testing.B, ctx context.Context, cs []*coordinator.Coordinator, sku string, buyers int, step time.Duration) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range buyers {
		wg.Go(func() {
			c := cs[g%len(cs)]
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				order := fmt.Sprintf("%s-g%d-%d", sku, g, i)
				_, err := c.AllocateFunc(ctx, sku, order, 1, fmt.Sprintf("user-%d", rand.Uint64()),
					func(context.Context) error { time.Sleep(step); return nil })
				if err != nil {
					b.Error(err)
					next.Store(int64(b.N)) // stop everyone: the figures would be wrong
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	return elapsed
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// pct is the p-th percentile of xs (exact, from all samples).
func pct(xs []float64, p int) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}
