package segments

import (
	"context"
	"fmt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"sync"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
)

// engineTestConfig is what a test may change of etcdEngine's defaults.
type engineTestConfig struct {
	tenureIdle, sellerIdle time.Duration
	client                 *clientv3.Client // nil: a new embedded etcd
	lazy                   bool
	seatAtStart            bool // Config.SeatAtStart
}

// etcdEngine is an engine on a real embedded etcd, with the coordinator's
// defaults (but for what opts change), closed at the end of the test.
func etcdEngine(tb testing.TB, opts ...func(*engineTestConfig)) *Engine {
	tb.Helper()
	tc := engineTestConfig{tenureIdle: 10 * time.Second, sellerIdle: 20 * time.Second}
	for _, o := range opts {
		o(&tc)
	}
	client := tc.client
	if client == nil {
		client = etcdtest.NewSingle(tb, etcdtest.WithNoFsync()).Client(tb)
	}
	bg := background.NewGroup()
	kv := etcdcall.KV(client)
	locks := lock.New(client, kv, bg, lock.Config{SessionTTL: 10 * time.Second, CohortMaxHandoffs: 32,
		CohortMaxHold: 100 * time.Millisecond, ReleaseTimeout: 5 * time.Second, TenureIdle: tc.tenureIdle})
	space, err := keys.New("/b/")
	if err != nil {
		tb.Fatal(err)
	}
	e := NewEngine(client, kv, locks, bg, Config{Keys: space, FallbackWait: 50 * time.Millisecond, ClaimWait: time.Second,
		TenureMaxHold: 250 * time.Millisecond, SellerIdle: tc.sellerIdle, MaxTxnOps: 128, CommitTimeout: 10 * time.Second, LazySegments: tc.lazy,
		SeatAtStart: tc.seatAtStart})
	tb.Cleanup(func() {
		_, _ = locks.Close()
		bg.Stop()
		bg.Wait()
	})
	return e
}

// BenchmarkLook is what a sold-out SKU's refusal costs in reads: G
// goroutines look at one empty 20-segment SKU flat out, each with an order
// ID of its own, the looks shared as they are in a storm. Reports looks/s
// and how many looks each shared read answered.
//
// Run: go test -run x -bench BenchmarkLook ./segments
func BenchmarkLook(b *testing.B) {
	e := etcdEngine(b)
	ctx := context.Background()
	if _, err := e.CreateSKU(ctx, "s", SKUConfig{Total: 0, Segments: 20}); err != nil {
		b.Fatal(err)
	}
	info, err := e.sku(ctx, "s")
	if err != nil {
		b.Fatal(err)
	}
	for _, g := range []int{1, 16, 100} {
		b.Run(fmt.Sprint(g, "goroutines"), func(b *testing.B) {
			var wg sync.WaitGroup
			per := b.N/g + 1
			start := time.Now()
			for w := range g {
				wg.Go(func() {
					for i := range per {
						if _, _, err := e.look(ctx, info, fmt.Sprintf("o-%d-%d", w, i)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(per*g)/time.Since(start).Seconds(), "looks/s")
		})
	}
}
