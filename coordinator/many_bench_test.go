package coordinator_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// BenchmarkManySKUs: the same load (400 goroutines over 4 coordinators,
// distinct 1-unit Allocate orders, flat out, for 5 s) on 1 SKU and spread
// uniformly over 1,000, etcd with fsync on. Reports orders/s, orders per
// group commit and the commit round trip, from the coordinators' metrics,
// so that the ratio 1,000 / 1 and where it goes are in one run;
// late-orders/s is the rate over the second half of the run, once every
// coordinator has met every SKU. The third run spreads the load over 1,000
// SKUs on an etcd with --max-txn-ops 1024 (and coordinators told so): a
// commit of many SKUs pays its compares and counter put per order, so
// etcd's default of 128 operations caps it at fewer orders than one SKU's.
//
// Run: go test -run x -bench BenchmarkManySKUs -benchtime 1x ./coordinator
func BenchmarkManySKUs(b *testing.B) {
	etcd := etcdtest.NewSingle(b)
	for _, tc := range []struct {
		skus      int
		maxTxnOps int // 0: etcd's default, 128
	}{{1, 0}, {1000, 0}, {1000, 1024}} {
		name := fmt.Sprint(tc.skus, "skus")
		if tc.maxTxnOps > 0 {
			name += fmt.Sprint("-maxtxnops", tc.maxTxnOps)
		}
		b.Run(name, func(b *testing.B) {
			skus := tc.skus
			server, opts := etcd, []coordinator.Option(nil)
			if tc.maxTxnOps > 0 {
				server = etcdtest.NewSingle(b, etcdtest.WithMaxTxnOps(uint(tc.maxTxnOps)))
				opts = append(opts, coordinator.WithMaxTxnOps(tc.maxTxnOps))
			}
			regs := make([]*prometheus.Registry, 4)
			cs := make([]*coordinator.Coordinator, 4)
			prefix := fmt.Sprintf("/many-%d-%x/", skus, rand.Uint32())
			for i := range cs {
				regs[i] = prometheus.NewRegistry()
				c, err := coordinator.New(server.Client(b), append([]coordinator.Option{coordinator.WithPrefix(prefix), coordinator.WithMetrics(regs[i])}, opts...)...)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				cs[i] = c
			}
			ctx := context.Background()
			parallel(b, skus, func(i int) error {
				_, err := cs[0].CreateSKU(ctx, fmt.Sprint("s", i), coordinator.SKUConfig{Total: 2_000_000, Segments: 20, InitialFill: 200_000})
				return err
			})
			var served, failed, late atomic.Int64
			deadline := time.Now().Add(5 * time.Second)
			half := time.Now().Add(2500 * time.Millisecond)
			start := time.Now()
			var wg sync.WaitGroup
			for g := range 400 {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(g), 1))
					for n := 0; time.Now().Before(deadline); n++ {
						if _, err := cs[g%4].Allocate(ctx, fmt.Sprint("s", r.IntN(skus)), fmt.Sprintf("o-%d-%d", g, n), 1, ""); err != nil {
							failed.Add(1)
						} else {
							served.Add(1)
							if time.Now().After(half) {
								late.Add(1)
							}
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			var batches, orders, commitSecs float64
			for _, reg := range regs {
				mfs, _ := reg.Gather()
				for _, mf := range mfs {
					switch mf.GetName() {
					case "stockctl_commit_batch_orders":
						h := mf.GetMetric()[0].GetHistogram()
						batches += float64(h.GetSampleCount())
						orders += h.GetSampleSum()
					case "stockctl_commit_duration_seconds":
						for _, m := range mf.GetMetric() {
							if label(m, "outcome") == "committed" {
								commitSecs += m.GetHistogram().GetSampleSum()
							}
						}
					}
				}
			}
			b.ReportMetric(float64(served.Load())/elapsed.Seconds(), "orders/s")
			b.ReportMetric(float64(late.Load())/time.Since(half).Seconds(), "late-orders/s")
			b.ReportMetric(float64(failed.Load()), "failed")
			b.ReportMetric(orders/batches, "orders/commit")
			b.ReportMetric(commitSecs/batches*1000, "ms/commit")
			b.ReportMetric(batches/elapsed.Seconds(), "commits/s")
		})
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
