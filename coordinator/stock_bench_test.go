package coordinator_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// BenchmarkHotSKU: one hot SKU, 200 goroutines across 4 coordinators,
// etcd with fsync on, in one run:
//
//	step20ms-20seg: AllocateFunc with a 20 ms business step, 20 segments
//	                (ideal: 20 / 20 ms = 1000 orders/s)
//	step20ms-1seg:  the same on one segment: the single-lock baseline
//	                (ideal 50 orders/s)
//	plain-20seg:    Allocate, no step: what group commit reaches
//
// b.N is the number of orders. Latency is end to end (call to return);
// service is from the step's start (the lock held) to the return. With 200
// closed-loop buyers, end-to-end latency is bounded below by Little's law:
// 200 / throughput.
//
// Run: go test -run x -bench BenchmarkHotSKU -benchtime 4000x ./coordinator
func BenchmarkHotSKU(b *testing.B) {
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
	type result struct{ rate, ideal float64 }
	results := map[string]result{}
	variants := []struct {
		name     string
		segments int
		step     time.Duration
	}{
		{"step20ms-20seg", 20, 20 * time.Millisecond},
		{"step20ms-1seg", 1, 20 * time.Millisecond},
		{"plain-20seg", 20, 0},
	}
	for vi, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			sku := fmt.Sprintf("hot-%d-%d", vi, b.N)
			// Twice the orders: the run measures a hot SKU in full sale, not
			// its sell-out (when segments run dry one by one and the
			// parallelism falls; the sale tests cover that).
			total := int64(2 * b.N)
			if _, err := cs[0].CreateSKU(context.Background(), sku, coordinator.SKUConfig{Total: total, Segments: v.segments, InitialFill: total}); err != nil {
				b.Fatal(err)
			}
			lat, service, elapsed := runBuyers(b, cs, sku, 200, v.step)
			rate := float64(b.N) / elapsed.Seconds()
			b.ReportMetric(rate, "orders/s")
			b.ReportMetric(pct(lat, 50), "p50-ms")
			b.ReportMetric(pct(lat, 99), "p99-ms")
			var ideal float64
			if v.step > 0 {
				ideal = float64(v.segments) / v.step.Seconds()
				b.ReportMetric(rate/ideal, "of-ideal")
				b.ReportMetric(pct(service, 99), "service-p99-ms")
			}
			results[v.name] = result{rate, ideal}
			r, err := cs[0].Audit(context.Background(), sku)
			if err != nil || !r.OK || r.Allocated != int64(b.N) {
				b.Fatalf("audit after the run: %+v %v", r, err)
			}
		})
	}
	seg, one, plain := results["step20ms-20seg"], results["step20ms-1seg"], results["plain-20seg"]
	if seg.rate > 0 && one.rate > 0 {
		fmt.Printf("20 ms step: 20 segments %.0f orders/s = %.2f of ideal %.0f, %.1fx one lock (%.0f/s = %.2f of its ideal %.0f); plain Allocate %.0f/s\n",
			seg.rate, seg.rate/seg.ideal, seg.ideal, seg.rate/one.rate, one.rate, one.rate/one.ideal, one.ideal, plain.rate)
	}
}

// runBuyers has buyers goroutines over cs place b.N orders of one unit
// (AllocateFunc with a sleep of step, or Allocate when step is 0), and
// returns the end-to-end and service latencies in ms and the elapsed time.
func runBuyers(b *testing.B, cs []*coordinator.Coordinator, sku string, buyers int, step time.Duration) (lat, service []float64, elapsed time.Duration) {
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < buyers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cs[g%len(cs)]
			var myLat, myService []float64
			defer func() {
				mu.Lock()
				lat, service = append(lat, myLat...), append(service, myService...)
				mu.Unlock()
			}()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				order := fmt.Sprintf("%s-g%d-%d", sku, g, i) // order IDs are global
				route := fmt.Sprintf("user-%d", rand.Uint64())
				t0 := time.Now()
				var stepStart time.Time
				var err error
				if step > 0 {
					_, err = c.AllocateFunc(ctx, sku, order, 1, route, func(context.Context) error {
						stepStart = time.Now()
						time.Sleep(step)
						return nil
					})
				} else {
					_, err = c.Allocate(ctx, sku, order, 1, route)
				}
				if err != nil {
					b.Error(err)
					next.Store(int64(b.N)) // stop everyone: the figures would be wrong
					return
				}
				end := time.Now()
				myLat = append(myLat, ms(end.Sub(t0)))
				if step > 0 {
					myService = append(myService, ms(end.Sub(stepStart)))
				}
			}
		}()
	}
	wg.Wait()
	elapsed = time.Since(start)
	b.StopTimer()
	return lat, service, elapsed
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

// benchTimeout bounds one benchmark variant's buyers.
var benchTimeout = 5 * time.Minute
