package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// BenchmarkSellOut: the end of a fragmented sale. Each iteration sells a
// fresh SKU of 2,000 units in 20 segments (no pool) to the last unit: 4
// coordinators × 50 buyers ordering 1–3 units, a buyer refused for 2 or 3
// trying 1, until told sold out (TestSaleSellsExactlyTheTotal's sale,
// with fsync on). The last units are scattered over segments that other
// processes hold, so this is where orders wait for each other's locks.
//
//	sellout-ms:    first order to the last buyer's sold-out answer
//	last10pct-ms:  from the 1,800th unit sold to the end
//	after-last-ms: from the last unit sold to the last buyer's sold-out
//	               answer: how long buyers still wait for an answer that
//	               can only be a refusal
//	p99-ms:        of served orders
//	txns/order:    etcd revisions over the sale ÷ served orders: write
//	               transactions (commits, lock keys put and deleted, moves)
//
// Run: go test -run x -bench BenchmarkSellOut -benchtime 5x ./coordinator
func BenchmarkSellOut(b *testing.B) {
	const (
		total    = 2000
		segments = 20
		procs    = 4
		buyers   = 50
	)
	etcd := etcdtest.NewSingle(b)
	raw := etcd.Client(b)
	cs := make([]*coordinator.Coordinator, procs)
	for i := range cs {
		c, err := coordinator.New(etcd.Client(b))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	// Bounded: a stuck sale ends the run with its error.
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	var sellout, last10, afterLast, txns []float64
	var lat []float64
	var orders int64
	for n := 0; b.Loop(); n++ {
		sku := fmt.Sprintf("sellout-%d", n)
		if _, err := cs[0].CreateSKU(ctx, sku, coordinator.SKUConfig{Total: total, Segments: segments, InitialFill: total}); err != nil {
			b.Fatal(err)
		}
		before, err := raw.Get(ctx, "sellout-revision")
		if err != nil {
			b.Fatal(err)
		}
		var (
			sold    atomic.Int64
			served  atomic.Int64
			mu      sync.Mutex
			at90    time.Time
			atLast  time.Time
			wg      sync.WaitGroup
			failure atomic.Pointer[error]
		)
		start := time.Now()
		for ci, c := range cs {
			for g := range buyers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(n), uint64(ci*buyers+g)))
					var mine []float64
					defer func() {
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					}()
					for k := 0; ; k++ {
						qty := int64(1 + rng.IntN(3))
						order := fmt.Sprintf("%s-c%d-g%d-%d", sku, ci, g, k)
						t0 := time.Now()
						a, err := c.Allocate(ctx, sku, order, qty, order)
						if errors.Is(err, coordinator.ErrInsufficientStock) {
							if qty > 1 {
								continue
							}
							return
						}
						if err != nil {
							failure.CompareAndSwap(nil, &err)
							return
						}
						mine = append(mine, ms(time.Since(t0)))
						served.Add(1)
						s := sold.Add(a.Qty)
						if s >= total*9/10 && s-a.Qty < total*9/10 {
							mu.Lock()
							at90 = time.Now()
							mu.Unlock()
						}
						if s == total {
							mu.Lock()
							atLast = time.Now()
							mu.Unlock()
						}
					}
				}()
			}
		}
		wg.Wait()
		end := time.Now()
		if err := failure.Load(); err != nil {
			b.Fatal(*err)
		}
		if sold.Load() != total {
			b.Fatalf("sold %d units of %d", sold.Load(), total)
		}
		after, err := raw.Get(ctx, "sellout-revision")
		if err != nil {
			b.Fatal(err)
		}
		sellout = append(sellout, float64(end.Sub(start).Milliseconds()))
		last10 = append(last10, float64(end.Sub(at90).Milliseconds()))
		afterLast = append(afterLast, float64(end.Sub(atLast).Milliseconds()))
		txns = append(txns, float64(after.Header.Revision-before.Header.Revision)/float64(served.Load()))
		orders += served.Load()
	}
	b.ReportMetric(pct(sellout, 50), "sellout-ms")
	b.ReportMetric(pct(last10, 50), "last10pct-ms")
	b.ReportMetric(pct(afterLast, 50), "after-last-ms")
	b.ReportMetric(pct(lat, 99), "p99-ms")
	b.ReportMetric(pct(txns, 50), "txns/order")
	b.ReportMetric(float64(orders)/float64(b.N), "orders/sale")
}
