package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// newFleetCoord returns a coordinator over two clusters, "first" and
// "second", on clients of its own, as a separate process would have.
func newFleetCoord(t testing.TB, first, second []string, opts ...coordinator.Option) *coordinator.Coordinator {
	t.Helper()
	c, err := coordinator.NewClusters(t.Context(), []coordinator.Cluster{
		{Name: "first", Client: etcdtest.NewClient(t, first...)},
		{Name: "second", Client: etcdtest.NewClient(t, second...)}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLeaderFailover's sale on a SKU of the second of two clusters, a
// 3-member one whose leader is stopped three times mid-sale, with that
// cluster's rebalancers (elected there) running: no oversell, the SKU
// sells out, its books balance. Meanwhile a SKU of the first cluster sells
// without a single error: a failover in one cluster is felt by its own
// SKUs only.
func TestLeaderFailoverOnSecondCluster(t *testing.T) {
	first := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cl := etcdtest.NewCluster(t, 3, etcdtest.WithNoFsync())
	const sku, total = "failover2", 1500
	opts := []coordinator.Option{coordinator.WithSessionTTL(5 * time.Second)}
	cs := make([]*coordinator.Coordinator, 4)
	for i := range cs {
		cs[i] = newFleetCoord(t, first.Endpoints(), cl.Endpoints(), opts...)
	}
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	if _, err := cs[0].CreateSKUIn(ctx, "second", sku, coordinator.SKUConfig{Total: total, Segments: 10, InitialFill: 300, LowWatermark: 10, RefillBatch: 30}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs[0].CreateSKUIn(ctx, "first", "calm", coordinator.SKUConfig{Total: 100000, Segments: 4, InitialFill: 100000}); err != nil {
		t.Fatal(err)
	}
	var moves moveLog
	for i, c := range cs[:2] {
		startRebalancer(t, c.Cluster("second"), rebalance.Config{Identity: fmt.Sprintf("rebalancer-%d", i), SweepInterval: 200 * time.Millisecond, OnMove: moves.add})
	}

	// The first cluster's SKU, sold throughout (bounded).
	stopCalm := make(chan struct{})
	var calmWG sync.WaitGroup
	var calmMu sync.Mutex
	calmOrders, calmErrs := 0, []error{}
	calmWG.Go(func() {
		for i := range 5000 {
			select {
			case <-stopCalm:
				return
			default:
			}
			octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := cs[i%len(cs)].Allocate(octx, "calm", fmt.Sprintf("c%d", i), 1, fmt.Sprint(i))
			ocancel()
			calmMu.Lock()
			calmOrders++
			if err != nil {
				calmErrs = append(calmErrs, err)
			}
			calmMu.Unlock()
		}
	})

	gate := newFaultGate(total, 0.2, 0.45, 0.7)
	wait := startSale(t, saleConfig(100, gatedBuy(gate, sku, cs)))
	for i := range 3 {
		etcdtest.WaitFor(t, fmt.Sprintf("threshold %d of the sale", i), 60*time.Second, func() bool { return gate.reached(i) })
		old := cl.Leader(t)
		gate.open(i)
		start := time.Now()
		cl.Stop(old)
		next := cl.Leader(t)
		elected := time.Since(start)
		cl.Restart(t, old)
		cl.WaitHealthy(t)
		t.Logf("failover %d in cluster second: stopped leader m%d, m%d led %v later", i+1, old, next, elected.Round(time.Millisecond))
	}
	res, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	close(stopCalm)
	calmWG.Wait()
	checkSoldOut(t, cs[0], sku, total, res)
	mustAudit(t, cs[1], "calm")
	t.Logf("rebalancer moves during the sale: %d; the first cluster's SKU: %d orders, %d errors", len(moves.snapshot()), calmOrders, len(calmErrs))
	if len(calmErrs) > 0 {
		t.Fatalf("%d of %d orders on the first cluster's SKU failed during the second's failovers; first: %v", len(calmErrs), calmOrders, calmErrs[0])
	}
	if calmOrders == 0 {
		t.Fatal("no order on the first cluster's SKU ran during the failovers")
	}
}

// Two clusters, each a separate etcd 3.4 process (Debian's etcd-server:
// etcdtest.NewExternal): a sale of a SKU in each by coordinators over both,
// one rebalancer elected per cluster; both sell out exactly, their books
// balance; then one etcd is stopped and the other's SKU still sells.
func TestClustersOnEtcd34(t *testing.T) {
	e1, e2 := etcdtest.NewExternal(t), etcdtest.NewExternal(t)
	t.Logf("etcd %s at %s and %s", e1.Version(), e1.Endpoints()[0], e2.Endpoints()[0])
	const total, buyers, perBuyer = 200, 8, 60
	cs := make([]*coordinator.Coordinator, 4)
	for i := range cs {
		cs[i] = newFleetCoord(t, e1.Endpoints(), e2.Endpoints())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute) // a hang guard
	defer cancel()
	for _, cl := range []string{"first", "second"} {
		if _, err := cs[0].CreateSKUIn(ctx, cl, "v34-"+cl, coordinator.SKUConfig{Total: total, Segments: 4, InitialFill: total / 4,
			LowWatermark: 5, RefillBatch: 10}); err != nil {
			t.Fatal(err)
		}
		startRebalancer(t, cs[1].Cluster(cl), rebalance.Config{Identity: "r34-" + cl, SweepInterval: 200 * time.Millisecond})
	}
	var mu sync.Mutex
	served := map[string]int64{}
	var failures []error
	var wg sync.WaitGroup
	for b := range buyers {
		sku := []string{"v34-first", "v34-second"}[b%2]
		wg.Go(func() {
			for i := range perBuyer {
				order := fmt.Sprintf("b%d-%d", b, i)
				var err error
				for range 5 { // an attempt that ran out of its deadline is retried under its order ID
					actx, acancel := context.WithTimeout(ctx, 30*time.Second)
					_, err = cs[b%len(cs)].Allocate(actx, sku, order, 1, order)
					acancel()
					if !errors.Is(err, context.DeadlineExceeded) {
						break
					}
				}
				mu.Lock()
				switch {
				case err == nil:
					served[sku]++
				case errors.Is(err, coordinator.ErrInsufficientStock):
				default:
					failures = append(failures, fmt.Errorf("%s %s: %w", sku, order, err))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, err := range failures {
		t.Error(err)
	}
	for _, cl := range []string{"first", "second"} {
		rep := mustAudit(t, cs[0], "v34-"+cl)
		if served["v34-"+cl] != total || rep.Allocated != total {
			t.Fatalf("v34-%s: %d served, %d allocated, want %d (4 buyers × %d orders for %d units)", cl, served["v34-"+cl], rep.Allocated, total, perBuyer, total)
		}
	}
	if _, err := cs[0].CreateSKUIn(ctx, "first", "after", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}); err != nil {
		t.Fatal(err)
	}
	e2.Stop()
	for i := range 5 {
		if _, err := cs[2].Allocate(ctx, "after", fmt.Sprint("a", i), 1, ""); err != nil {
			t.Fatalf("the first cluster's SKU with the second's etcd stopped: %v", err)
		}
	}
	sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
	defer scancel()
	if _, err := cs[2].Allocate(sctx, "v34-second", "x", 1, ""); !errors.Is(err, coordinator.ErrClusterUnavailable) {
		t.Fatalf("the stopped cluster's SKU: %v, want ErrClusterUnavailable", err)
	}
}
