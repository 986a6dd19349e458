package coordinator_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// BenchmarkAllocateMetrics: the hot path with and without WithMetrics, in
// one run: plain Allocate (no step, the most calls per second, so the
// largest share of metric work), 200 goroutines over 4 coordinators, 20
// segments, etcd with fsync on. The variants alternate (off, on, off, on)
// so that a change of the machine's load hits both; compare the orders/s
// of the pairs.
//
// Run: go test -run x -bench BenchmarkAllocateMetrics -benchtime 20000x ./coordinator
func BenchmarkAllocateMetrics(b *testing.B) {
	etcd := etcdtest.NewSingle(b)
	for round := range 2 {
		for _, on := range []bool{false, true} {
			name := fmt.Sprintf("off-%d", round)
			if on {
				name = fmt.Sprintf("on-%d", round)
			}
			b.Run(name, func(b *testing.B) {
				cs := make([]*coordinator.Coordinator, 4)
				for i := range cs {
					var opts []coordinator.Option
					if on {
						opts = append(opts, coordinator.WithMetrics(prometheus.NewRegistry()))
					}
					c, err := coordinator.New(etcd.Client(b), opts...)
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					cs[i] = c
				}
				sku := fmt.Sprintf("metrics-%s-%d-%d", name, b.N, benchSKUs.Add(1))
				total := int64(2 * b.N)
				if _, err := cs[0].CreateSKU(context.Background(), sku, coordinator.SKUConfig{Total: total, Segments: 20, InitialFill: total}); err != nil {
					b.Fatal(err)
				}
				_, _, elapsed := runBuyers(b, cs, sku, 200, 0)
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "orders/s")
			})
		}
	}
}

// benchSKUs numbers the benchmarks' SKUs: with -count, a benchmark runs
// again against the same etcd.
var benchSKUs atomic.Int64
