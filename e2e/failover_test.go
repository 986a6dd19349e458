package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// The raft leader of a 3-member embedded cluster is stopped and restarted
// three times during a sale of 100 buyers (at 20%, 45% and 70% of the stock
// sold), with two rebalancers running. Meanwhile five clients call
// allocate / release / restock / status on a second SKU.
//
// Invariants:
//   - no oversell: buyers are never sold more than the stock, and once sold
//     out the active orders in etcd add up to exactly the total;
//   - the books of both SKUs balance;
//   - the sale completes: every buyer is told the SKU is sold out;
//   - the second SKU's history is linearizable (porcupine, one-SKU model).
func TestLeaderFailover(t *testing.T) {
	cl := etcdtest.NewCluster(t, 3, etcdtest.WithNoFsync())
	const sku, total = "failover", 1500
	const linSKU, linTotal, linRestock = "lin-failover", 40, 6
	opts := []coordinator.Option{coordinator.WithSessionTTL(5 * time.Second)}
	cs := make([]*coordinator.Coordinator, 4)
	for i := range cs {
		cs[i] = newCoord(t, cl.Endpoints(), opts...)
	}
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	if _, err := cs[0].CreateSKU(ctx, sku, coordinator.SKUConfig{Total: total, Segments: 10, InitialFill: 300, LowWatermark: 10, RefillBatch: 30}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs[0].CreateSKU(ctx, linSKU, coordinator.SKUConfig{Total: linTotal, Segments: 4, InitialFill: 12, LowWatermark: 2, RefillBatch: 4}); err != nil {
		t.Fatal(err)
	}
	var moves moveLog
	for i, c := range cs[:2] {
		startRebalancer(t, c, rebalance.Config{Identity: fmt.Sprintf("rebalancer-%d", i), SweepInterval: 200 * time.Millisecond, OnMove: moves.add})
	}

	linClients := make([]*coordinator.Coordinator, 5)
	for i := range linClients {
		linClients[i] = newCoord(t, cl.Endpoints(), opts...)
	}
	lin := &linWorkload{SKU: linSKU, Clients: linClients, MaxOps: 120, Timeout: 3 * time.Second, Pace: 60 * time.Millisecond, Restock: linRestock}
	stopLin := make(chan struct{})
	checkLin := runLinearizability(t, lin, linTotal, linTotal, stopLin, linClients, cs[0])

	gate := newFaultGate(total, 0.2, 0.45, 0.7)
	wait := startSale(t, saleConfig(100, gatedBuy(gate, sku, cs)))
	for i := range 3 {
		etcdtest.WaitFor(t, fmt.Sprintf("threshold %d of the sale", i), 60*time.Second, func() bool { return gate.reached(i) })
		old := cl.Leader(t)
		gate.open(i)
		start := time.Now()
		cl.Stop(old) // with buyers and rebalancers in flight
		next := cl.Leader(t)
		elected := time.Since(start)
		cl.Restart(t, old)
		cl.WaitHealthy(t)
		t.Logf("failover %d: stopped leader m%d, m%d led %v later; m%d back and the cluster healthy after %v",
			i+1, old, next, elected.Round(time.Millisecond), old, time.Since(start).Round(time.Millisecond))
	}
	res, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	close(stopLin)
	checkSoldOut(t, cs[0], sku, total, res)
	t.Logf("rebalancer moves during the sale: %d", len(moves.snapshot()))
	checkLin()
	mustAudit(t, cs[0], linSKU)
}
