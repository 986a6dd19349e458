package feed_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// The benchmark's sale: a pure-allocation sale at full speed, as in
// docs/benchmarks.md (4 coordinators, each its own etcd client, on one
// embedded etcd with fsync; 400 goroutines placing distinct 1-unit
// orders), bounded in count and in time.
const (
	benchCoordinators = 4
	benchGoroutines   = 400
	benchOrders       = 30_000
	benchSegments     = 20
	benchMaxTime      = 60 * time.Second
)

// BenchmarkFeedLag runs the sale while a feed of its SKU consumes it, and
// reports the feed's throughput and its lag: from the moment Allocate
// returned to its caller (the order's commit as the caller sees it) to the
// moment the feed delivered the order's event.
//
//	go test -run '^$' -bench FeedLag -benchtime 1x ./feed
func BenchmarkFeedLag(b *testing.B) {
	for b.Loop() {
		r := runFeedSale(b)
		b.ReportMetric(r.ordersPerSec, "orders/s")
		b.ReportMetric(r.eventsPerSec, "events/s")
		b.ReportMetric(ms(r.lag(0.50)), "lag-p50-ms")
		b.ReportMetric(ms(r.lag(0.99)), "lag-p99-ms")
		b.ReportMetric(ms(r.lag(1)), "lag-max-ms")
		b.ReportMetric(ms(r.signed[len(r.signed)/2]), "signed-lag-p50-ms")
		b.ReportMetric(r.early, "delivered-before-return")
		b.ReportMetric(float64(r.batches), "batches")
		b.Logf("%d orders in %v (%.0f orders/s); feed %.0f events/s in %d batches; lag p50 %v p99 %v max %v; "+
			"%.1f%% delivered before Allocate returned (signed p50 %v)",
			r.orders, r.sale.Round(time.Millisecond), r.ordersPerSec, r.eventsPerSec, r.batches,
			r.lag(0.5).Round(time.Microsecond), r.lag(0.99).Round(time.Microsecond), r.lag(1).Round(time.Microsecond),
			100*r.early, r.signed[len(r.signed)/2].Round(time.Microsecond))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type feedSaleResult struct {
	orders       int
	sale         time.Duration
	ordersPerSec float64
	eventsPerSec float64
	batches      int
	lags         []time.Duration // sorted; a delivery before the return counts 0
	signed       []time.Duration // sorted; negative for a delivery before the return
	early        float64         // the fraction delivered before Allocate returned
}

func (r feedSaleResult) lag(q float64) time.Duration {
	if len(r.lags) == 0 {
		return 0
	}
	return r.lags[min(len(r.lags)-1, int(q*float64(len(r.lags))))]
}

func runFeedSale(b *testing.B) feedSaleResult {
	e := etcdtest.NewSingle(b) // fsync on, as a real etcd
	const prefix = "/bench/"
	var coords []*coordinator.Coordinator
	for range benchCoordinators {
		coords = append(coords, newCoordinator(b, e.Client(b), prefix))
	}
	createCtx, cancelCreate := context.WithTimeout(context.Background(), hang)
	defer cancelCreate()
	if _, err := coords[0].CreateSKU(createCtx, "phone", coordinator.SKUConfig{Total: benchOrders, Segments: benchSegments,
		InitialFill: benchOrders}); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), benchMaxTime+hang)
	defer cancel()
	reader := e.Client(b)
	now, err := reader.Get(ctx, prefix)
	if err != nil {
		b.Fatal(err)
	}
	f, err := feed.Open(ctx, reader, feed.Config{Prefix: prefix, SKU: "phone", Since: now.Header.Revision})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()

	returned := make([]time.Time, benchOrders) // by order number; each written by one goroutine
	delivered := make([]time.Time, benchOrders)
	var placed, got atomic.Int64
	feedCtx, stopFeed := context.WithCancel(ctx)
	feedDone := make(chan struct{})
	var batches int
	var first, last time.Time
	go func() {
		defer close(feedDone)
		for {
			batch, err := f.Next(feedCtx)
			if err != nil {
				if feedCtx.Err() == nil {
					b.Errorf("feed: %v", err)
				}
				return
			}
			at := time.Now()
			if batches == 0 {
				first = at
			}
			batches++
			last = at
			for _, ev := range batch.Events {
				i, err := strconv.Atoi(strings.TrimPrefix(ev.Order, "o-"))
				if err != nil || ev.Kind != feed.Allocated {
					b.Errorf("unexpected event %+v", ev)
					return
				}
				delivered[i] = at
			}
			got.Add(int64(len(batch.Events)))
		}
	}()

	var next atomic.Int64
	stop := time.Now().Add(benchMaxTime)
	start := time.Now()
	var wg sync.WaitGroup
	for g := range benchGoroutines {
		wg.Go(func() {
			c := coords[g%len(coords)]
			for time.Now().Before(stop) {
				i := next.Add(1) - 1
				if i >= benchOrders {
					return
				}
				id := fmt.Sprintf("o-%d", i)
				if _, err := c.Allocate(ctx, "phone", id, 1, id); err != nil {
					b.Errorf("allocate %s: %v", id, err)
					return
				}
				returned[i] = time.Now()
				placed.Add(1)
			}
		})
	}
	wg.Wait()
	sale := time.Since(start)
	for deadline := time.Now().Add(hang); got.Load() < placed.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("the feed delivered %d events of %d within %v", got.Load(), placed.Load(), hang)
		}
	}
	stopFeed()
	<-feedDone
	r := feedSaleResult{orders: int(placed.Load()), sale: sale, batches: batches}
	r.ordersPerSec = float64(r.orders) / sale.Seconds()
	if d := last.Sub(first); d > 0 {
		r.eventsPerSec = float64(r.orders) / d.Seconds()
	}
	early := 0
	for i := range r.orders {
		if returned[i].IsZero() || delivered[i].IsZero() {
			b.Fatalf("order o-%d: returned %v, delivered %v", i, returned[i], delivered[i])
		}
		lag := delivered[i].Sub(returned[i])
		r.signed = append(r.signed, lag)
		if lag < 0 {
			early++
			lag = 0
		}
		r.lags = append(r.lags, lag)
	}
	slices.Sort(r.lags)
	slices.Sort(r.signed)
	r.early = float64(early) / float64(r.orders)
	return r
}
