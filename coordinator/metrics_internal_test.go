package coordinator

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockctl/stockctl/segments"
)

// BenchmarkMetricsPerOrder is the metric work one plain order adds to the
// hot path when it is served from a segment this process holds: its
// outcome, the local handoff of the segment's lock and its wait, and its
// share of a group commit (here a batch of 8). Divide by the CPU time an
// allocation costs (2 cores ÷ BenchmarkAllocateMetrics's orders/s) for the
// overhead.
//
// Run: go test -run x -bench BenchmarkMetricsPerOrder ./coordinator
func BenchmarkMetricsPerOrder(b *testing.B) {
	c := &Coordinator{}
	m := newMetrics(c)
	if err := prometheus.NewRegistry().Register(m); err != nil {
		b.Fatal(err)
	}
	a := &Allocation{SKU: "hot", Qty: 1, Parts: []segments.Part{{Place: segments.Segment(3), Qty: 1}}}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			m.allocated("allocate", "hot", a, nil)
			m.handoff(lockSegment, viaLocal)
			m.lockWaited(lockSegment, 20*time.Microsecond, nil)
			if i%8 == 0 {
				m.committed(8, 2*time.Millisecond, "committed")
			}
			i++
		}
	})
}
