package segments

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkMetricsPerOrder is the stock metric work one plain order adds to
// the hot path: its outcome and its share of a group commit (here a batch
// of 8). The lock engine's part (the local handoff of the segment's lock
// and its wait) is internal/lock's BenchmarkLockMetricsPerOrder; add the
// two and divide by the CPU time an allocation costs (2 cores ÷
// BenchmarkAllocateMetrics's orders/s) for the overhead.
//
// Run: go test -run x -bench MetricsPerOrder ./segments ./internal/lock
func BenchmarkMetricsPerOrder(b *testing.B) {
	m := NewMetrics()
	if err := prometheus.NewRegistry().Register(m); err != nil {
		b.Fatal(err)
	}
	a := &Allocation{SKU: "hot", Qty: 1, Parts: []Part{{Place: Segment(3), Qty: 1}}}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			m.allocated("allocate", "hot", a, nil)
			if i%8 == 0 {
				m.committed(8, 2*time.Millisecond, "committed")
			}
			i++
		}
	})
}
