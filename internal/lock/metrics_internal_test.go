package lock

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkLockMetricsPerOrder is the lock metric work one plain order adds
// to the hot path when it is served from a segment this process holds: the
// local handoff of the segment's lock and its wait. See segments'
// BenchmarkMetricsPerOrder for the rest.
func BenchmarkLockMetricsPerOrder(b *testing.B) {
	m := NewMetrics()
	reg := prometheus.NewRegistry()
	for _, c := range m.Collectors() {
		if err := reg.Register(c); err != nil {
			b.Fatal(err)
		}
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.handoff(KindSegment, viaLocal)
			m.lockWaited(KindSegment, 20*time.Microsecond, nil)
		}
	})
}
