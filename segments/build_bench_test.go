package segments

import (
	"fmt"
	"testing"
)

// BenchmarkBuild measures building one batch's transaction (planned, split
// into groups and built: txnGroups), per order, with -benchmem: the
// allocations of the commit path that every order pays, in-process or
// through the API (a profile of `stockctl serve` put half of its
// allocations here).
//   - held: 48 orders on one held place, one group (one SKU's commits carry
//     ~48 orders, `bench --sale` shape one);
//   - direct: 20 orders on 20 direct places, a group each (many SKUs: ~21).
func BenchmarkBuild(b *testing.B) {
	e := testEngine(b)
	held := newTestPlace(0, 1<<40, 0)
	cases := []struct {
		name  string
		batch func() []*commitReq
	}{
		{"held-48", func() []*commitReq {
			var batch []*commitReq
			for i := range 48 {
				batch = append(batch, order(fmt.Sprint("o", i), held.part(1)))
			}
			return batch
		}},
		{"direct-20", func() []*commitReq {
			var batch []*commitReq
			for i := range 20 {
				d := &placeState{sku: "s", place: Segment(i), key: fmt.Sprintf("/t/stock/s/seg/%d", i), inKey: fmt.Sprintf("/t/stock/s/in/%d", i),
					direct: directState{known: true, value: 1 << 40, mod: 5, raw: SegmentCounter{N: 1 << 40}}}
				batch = append(batch, order(fmt.Sprint("o", i), commitPart{st: d, qty: 1, direct: true, lockPfx: fmt.Sprintf("/t/stocklocks/s/seg/%d/", i)}))
			}
			return batch
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			batch := c.batch()
			_, order := e.planPlaces(b.Context(), batch)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				e.txnGroups(batch, order, nil)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/order")
			b.StopTimer()
		})
	}
}
