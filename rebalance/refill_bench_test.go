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

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
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
// Refill latency is measured by an observer outside the rebalancer: one
// watch on the SKU's counters, which timestamps the event that takes a
// segment's stock (counter + inbox) below the watermark and the event of the
// refill that follows it. Both arrive on the same watch stream, so its
// delivery delay cancels out. The rebalancer's own figure (Move.Latency,
// from its seeing the crossing to its commit) is reported beside it.
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
			var obs *refillObserver
			var self []float64
			var selfMu sync.Mutex
			var rwg sync.WaitGroup
			rctx, stopRebalancer := context.WithCancel(ctx)
			defer func() { stopRebalancer(); rwg.Wait() }()
			if name == "rebalancer" {
				var err error
				if obs, err = newRefillObserver(ctx, etcd.Client(b), sku, segs, watermark); err != nil {
					b.Fatal(err)
				}
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
				lat, pending := obs.stop()
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
				if pending > 0 {
					b.Logf("%d segments still below the watermark, not yet refilled, when the sale stopped", pending)
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

// refillObserver watches one SKU's segment counters and inboxes and times
// each crossing below the watermark to the refill that ends it.
type refillObserver struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	lat     []float64
	crossed []time.Time // per segment; zero: not waiting for a refill
}

func newRefillObserver(ctx context.Context, cli *clientv3.Client, sku string, segs int, watermark int64) (*refillObserver, error) {
	space, err := keys.New(coordinator.DefaultPrefix)
	if err != nil {
		return nil, err
	}
	resp, err := cli.Get(ctx, space.SKUStock(sku), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	seg, in := make([]int64, segs), make([]int64, segs)
	apply := func(kv []byte, value []byte) (keys.StockKey, int64, bool) {
		k, err := space.ParseStock(string(kv))
		if err != nil || k.Kind == keys.KindPool {
			return k, 0, false
		}
		n, err := segments.DecodeCounter(string(kv), value)
		if err != nil {
			return k, 0, false
		}
		return k, n, true
	}
	for _, kv := range resp.Kvs {
		if k, n, ok := apply(kv.Key, kv.Value); ok {
			if k.Kind == keys.KindInbox {
				in[k.Index] = n
			} else {
				seg[k.Index] = n
			}
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	o := &refillObserver{cancel: cancel, done: make(chan struct{})}
	o.crossed = make([]time.Time, segs)
	crossed := o.crossed
	wch := cli.Watch(wctx, space.SKUStock(sku), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	go func() {
		defer close(o.done)
		for wr := range wch {
			now := time.Now()
			for _, ev := range wr.Events {
				k, n, ok := apply(ev.Kv.Key, ev.Kv.Value)
				if !ok {
					continue
				}
				i := k.Index
				before := seg[i] + in[i]
				refilled := k.Kind == keys.KindInbox && n > in[i]
				if k.Kind == keys.KindInbox {
					in[i] = n
				} else {
					seg[i] = n
				}
				after := seg[i] + in[i]
				o.mu.Lock()
				switch {
				case refilled && !crossed[i].IsZero():
					o.lat = append(o.lat, ms(now.Sub(crossed[i])))
					crossed[i] = time.Time{}
				case before >= watermark && after < watermark:
					crossed[i] = now
				}
				o.mu.Unlock()
			}
		}
	}()
	return o, nil
}

// stop ends the watch and returns the latencies (ms) and how many segments
// were still waiting for a refill.
func (o *refillObserver) stop() (lat []float64, pending int) {
	o.cancel()
	<-o.done
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, t := range o.crossed {
		if !t.IsZero() {
			pending++
		}
	}
	return slices.Clone(o.lat), pending
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
