package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Two `stockctl serve` OS processes (the built binary) share one etcd.
// Buyers, Go clients speaking gRPC, order through both; one process is
// SIGKILLed mid-sale (holding segment locks, with calls in flight), and its
// buyers retry each order through the other under the same order ID.
//
// Invariants:
//   - every order a buyer started is acknowledged in the end: by A before
//     the kill, or by B (a new commit, or a replay of what A committed
//     before it died);
//   - every acknowledged order is recorded exactly once, for its quantity:
//     its claim and record are in etcd, a retry of it through B replays
//     the acknowledged outcome (same revision) and deducts nothing, and the
//     audit through B balances with allocated = the sum of the acknowledged
//     quantities and orders = their count;
//   - some order failed on A after the kill and was served by B (the
//     failover happened), and B stops with exit 0 on SIGTERM.
func TestServeKilledMidSale(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	bin := buildStockctl(t)
	const sku = "served-kill"
	procs := []*serveProc{startServe(t, bin, etcd.Endpoints(), "serve-a"), startServe(t, bin, etcd.Endpoints(), "serve-b")}
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &h2c}
	defer tr.CloseIdleConnections()
	var clients []stockctlv1connect.StockServiceClient
	for _, p := range procs {
		clients = append(clients, stockctlv1connect.NewStockServiceClient(&http.Client{Transport: tr}, p.api, connect.WithGRPC()))
	}
	ctx := t.Context()
	if _, err := clients[1].CreateSKU(ctx, connect.NewRequest(&stockctlv1.CreateSKURequest{
		Sku: sku, Total: 1_000_000, Segments: 8, InitialFill: 16_000, LowWatermark: 200, RefillBatch: 1000})); err != nil {
		t.Fatal(err)
	}

	type ack struct {
		order    string
		qty, rev int64
	}
	const (
		buyers    = 8
		afterKill = 15   // orders each buyer starts after the kill
		maxOrders = 5000 // per buyer: a bound in case the kill never comes
		attempts  = 50   // per order
	)
	acks := make([][]ack, buyers) // each buyer appends to its own
	var acked, ackedByA, failedOver atomic.Int64
	var killed atomic.Bool
	var wg sync.WaitGroup
	for b := range buyers {
		wg.Go(func() {
			home := b % 2 // half the buyers order through A first
			after := 0
			for n := 0; n < maxOrders && after < afterKill; n++ {
				if killed.Load() {
					after++
				}
				req := &stockctlv1.AllocateRequest{Sku: sku, Order: fmt.Sprintf("b%d-%d", b, n), Qty: int64(1 + n%3), RouteKey: fmt.Sprintf("user-%d", b)}
				srv, failedOnA := home, false
				for attempt := 1; ; attempt++ {
					actx, cancel := context.WithTimeout(ctx, serveBound)
					res, err := clients[srv].Allocate(actx, connect.NewRequest(req))
					cancel()
					if err == nil {
						if res.Msg.Qty != req.Qty {
							t.Errorf("order %s: asked %d, acknowledged %d", req.Order, req.Qty, res.Msg.Qty)
						}
						acks[b] = append(acks[b], ack{order: req.Order, qty: res.Msg.Qty, rev: res.Msg.Revision})
						acked.Add(1)
						if srv == 0 {
							ackedByA.Add(1)
						} else if failedOnA {
							failedOver.Add(1)
						}
						break
					}
					if refusal(err) {
						t.Errorf("order %s through %s: %v (not a failure to retry)", req.Order, procs[srv].name, err)
						return
					}
					if attempt == attempts || ctx.Err() != nil {
						t.Errorf("order %s: gave up after %d attempts: %v", req.Order, attempt, err)
						return
					}
					failedOnA = failedOnA || srv == 0
					srv = 1 - srv // the other server, with the same order ID
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}

	// Mid-sale: both servers have served, and A holds segment locks.
	etcdtest.WaitFor(t, "orders acknowledged through both servers", serveBound, func() bool {
		return acked.Load() >= 200 && ackedByA.Load() >= 50 && acked.Load()-ackedByA.Load() >= 50
	})
	procs[0].kill(t)
	killed.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("buyers still ordering 5 minutes after the kill")
	}
	if t.Failed() {
		return
	}
	if failedOver.Load() == 0 {
		t.Fatal("no order failed on A after the kill and was served by B: the failover was not exercised")
	}

	// Every acknowledged order: recorded with its quantity, and a retry
	// through B replays it.
	check := newCoord(t, etcd.Endpoints())
	var units, orders int64
	for b := range buyers {
		for _, a := range acks[b] {
			o, recorded := orderState(t, check, sku, a.order)
			if !recorded || o.Qty != a.qty {
				t.Fatalf("acknowledged order %s (%d units at revision %d): recorded %v, %+v", a.order, a.qty, a.rev, recorded, o)
			}
			res, err := clients[1].Allocate(ctx, connect.NewRequest(&stockctlv1.AllocateRequest{Sku: sku, Order: a.order, Qty: a.qty, RouteKey: fmt.Sprintf("user-%d", b)}))
			if err != nil || !res.Msg.Replayed || res.Msg.Revision != a.rev {
				t.Fatalf("retry of acknowledged order %s (revision %d) through B: %v %v", a.order, a.rev, res, err)
			}
			units += a.qty
			orders++
		}
	}
	au, err := clients[1].Audit(ctx, connect.NewRequest(&stockctlv1.AuditRequest{Sku: sku}))
	if err != nil {
		t.Fatal(err)
	}
	if !au.Msg.Ok || au.Msg.Allocated != units || au.Msg.Orders != orders {
		t.Fatalf("audit through B: ok %v, allocated %d in %d orders (problems %v); the buyers were acknowledged %d units in %d orders",
			au.Msg.Ok, au.Msg.Allocated, au.Msg.Orders, au.Msg.Problems, units, orders)
	}
	t.Logf("%d orders (%d units) acknowledged, %d through A before its kill, %d failed on A and served by B", orders, units, ackedByA.Load(), failedOver.Load())
	procs[1].term(t)
}

// refusal reports whether err is the server's answer about the order (bad
// input, a conflict, no stock), which a retry cannot change. Anything else
// (a reset connection, a refused one, UNAVAILABLE, a deadline) leaves the
// order's outcome unknown: retry it under its order ID.
func refusal(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeAlreadyExists, connect.CodeNotFound,
		connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeUnimplemented:
		return true
	}
	return false
}
