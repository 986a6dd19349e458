package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Client A reaches etcd through a TCP proxy (go.etcd.io/etcd/pkg/v3/proxy);
// B and C directly. A holds a named lock and a segment (inside an
// AllocateFunc step) when the proxy is blackholed. Meanwhile three clients,
// one of them behind the same proxy, call allocate / release / restock /
// status on a second SKU.
//
// Invariants:
//   - A's lost signal fires (Lock.Done, ErrLockLost) and its allocation in
//     progress fails with ErrLockLost, deducting nothing;
//   - A's fenced writes are rejected, during the partition and after it heals;
//   - B and C go on: B takes the lock and writes, both keep allocating;
//   - after healing, A works again on a new session (new lease): it locks,
//     writes fenced and allocates;
//   - the books balance, and the second SKU's history is linearizable.
func TestClientPartition(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	proxy := etcdtest.NewProxy(t, etcd.Endpoints()[0])
	const sku, segs, lockName, data = "partition", 4, "partition", "/e2e/partition/data"
	const linSKU, linTotal = "lin-partition", 40
	opts := []coordinator.Option{coordinator.WithSessionTTL(ttl), coordinator.WithReleaseTimeout(200 * time.Millisecond)}
	a := newCoord(t, []string{proxy.Endpoint()}, opts...)
	b := newCoord(t, etcd.Endpoints(), opts...)
	c := newCoord(t, etcd.Endpoints(), opts...)
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	if _, err := b.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: 4000, Segments: segs, InitialFill: 4000}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSKU(ctx, linSKU, coordinator.SKUConfig{Total: linTotal, Segments: 2, InitialFill: linTotal}); err != nil {
		t.Fatal(err)
	}
	linClients := []*coordinator.Coordinator{
		newCoord(t, []string{proxy.Endpoint()}, opts...), // cut off with A
		newCoord(t, etcd.Endpoints(), opts...),
		newCoord(t, etcd.Endpoints(), opts...),
	}
	lin := &linWorkload{SKU: linSKU, Clients: linClients, MaxOps: 150, Timeout: 2 * time.Second, Pace: 40 * time.Millisecond, Restock: 5}
	stopLin := make(chan struct{})
	checkLin := runLinearizability(t, lin, linTotal, linTotal, stopLin, linClients, b)

	held, err := a.Lock(ctx, lockName)
	if err != nil {
		t.Fatal(err)
	}
	if tr, err := held.Txn(ctx).Then(clientv3.OpPut(data, "A")).Commit(); err != nil || !tr.Succeeded {
		t.Fatalf("A's first fenced write: %v", err)
	}
	inStep := make(chan struct{})
	allocErr := make(chan error, 1)
	route := routeKeyFor(t, segs, 0)
	go func() {
		_, err := a.AllocateFunc(ctx, sku, "a-in-flight", 1, route, func(sctx context.Context) error {
			close(inStep)
			<-sctx.Done() // a long business step, cut short by the lost lock
			return context.Cause(sctx)
		})
		allocErr <- err
	}()
	<-inStep

	proxy.Blackhole()
	cutAt := time.Now()
	select {
	case <-held.Done():
	case <-time.After(3*ttl + 5*time.Second):
		t.Fatal("A's lost signal did not fire")
	}
	lostAfter := time.Since(cutAt)
	if !errors.Is(held.Err(), coordinator.ErrLockLost) {
		t.Fatalf("A's lock: %v, want ErrLockLost", held.Err())
	}
	select {
	case err := <-allocErr:
		if !errors.Is(err, coordinator.ErrLockLost) {
			t.Fatalf("A's allocation in progress: %v, want ErrLockLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A's allocation in progress did not end after its lock was lost")
	}

	// The others go on.
	other, err := b.Lock(ctx, lockName)
	if err != nil {
		t.Fatal(err)
	}
	if tr, err := other.Txn(ctx).Then(clientv3.OpPut(data, "B")).Commit(); err != nil || !tr.Succeeded {
		t.Fatalf("B's fenced write during the partition: %v", err)
	}
	var servedDuring atomic.Int64
	for i, cc := range []*coordinator.Coordinator{b, c} {
		for n := range 20 {
			order := fmt.Sprintf("during-%d-%d", i, n)
			if _, err := cc.Allocate(ctx, sku, order, 1, order); err != nil {
				t.Fatalf("allocation by a client on the right side of the partition: %v", err)
			}
			servedDuring.Add(1)
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	_, err = held.Txn(wctx).Then(clientv3.OpPut(data, "A-stale")).Commit()
	wcancel()
	if err == nil {
		t.Fatal("A's fenced write went through a blackholed proxy")
	}

	proxy.Unblackhole()
	healedAt := time.Now()
	var denied bool
	retry(t, "A's stale fenced write after healing", 30*time.Second, anyErr, func(ctx context.Context) error {
		tr, err := held.Txn(ctx).Then(clientv3.OpPut(data, "A-stale")).Commit()
		if err == nil {
			denied = !tr.Succeeded
		}
		return err
	})
	if !denied {
		t.Fatal("A's fenced write with its lost lock was applied after healing")
	}
	if got := mustGetString(t, b.Client(), data); got != "B" {
		t.Fatalf("the data holds %q, want B's write", got)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A works again, on a new session.
	var again *coordinator.Lock
	retry(t, "A's lock after healing", 30*time.Second, anyErr, func(ctx context.Context) (err error) {
		again, err = a.Lock(ctx, lockName)
		return err
	})
	recovered := time.Since(healedAt)
	if again.Lease() == held.Lease() {
		t.Fatal("A reused its lost lease")
	}
	if tr, err := again.Txn(ctx).Then(clientv3.OpPut(data, "A-again")).Commit(); err != nil || !tr.Succeeded {
		t.Fatalf("A's fenced write on its new session: %v", err)
	}
	if err := again.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := retry(t, "A's allocation after healing", 30*time.Second, notStockAnswer, func(ctx context.Context) error {
		_, err := a.Allocate(ctx, sku, "a-after", 1, "a-after")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, ok := orderState(t, b, sku, "a-in-flight"); ok {
		t.Fatal("A's allocation cut short by the partition was recorded")
	}
	close(stopLin)
	rep := mustAudit(t, b, sku)
	t.Logf("partition: A told of the loss %v after the cut (TTL %v); %d orders served on the other side meanwhile; A's stale fenced writes rejected during and after; A locked again on a new lease %v after healing; audit %+v",
		lostAfter.Round(time.Millisecond), ttl, servedDuring.Load(), recovered.Round(time.Millisecond), *rep)
	checkLin()
	mustAudit(t, b, linSKU)
}

func mustGetString(t testing.TB, cli *clientv3.Client, key string) string {
	t.Helper()
	var v string
	retry(t, "get "+key, 20*time.Second, anyErr, func(ctx context.Context) error {
		resp, err := cli.Get(ctx, key)
		if err == nil && len(resp.Kvs) > 0 {
			v = string(resp.Kvs[0].Value)
		}
		return err
	})
	return v
}
