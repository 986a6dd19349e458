package coordinator_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// An order with a business step never holds the pool's lock through its
// step, even when its process holds no segment and the stock it needs is
// in the pool and in a segment another process is selling from (the case
// that used to gather the pool and the segment, the pool held through the
// step). Its stock is moved into a segment first, and the step runs under
// segment locks only; the books balance.
func TestStepNeverHoldsThePool(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	raw := etcd.Client(t)
	a, err := coordinator.New(etcd.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := coordinator.New(etcd.Client(t), coordinator.WithWaitBudgets(50*time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const sku = "one-seg"
	mustCreate(t, a, sku, coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 2, RefillBatch: 1})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	// A sells from the only segment and stays in its step until told.
	inStep, release := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := a.AllocateFunc(ctx, sku, "a-1", 1, "", func(context.Context) error {
			close(inStep)
			<-release
			return nil
		})
		aDone <- err
	}()
	<-inStep

	// B needs 5: the segment has 1 left, the pool 8. Its step looks for
	// any key under the pool's lock.
	poolHeld := make(chan int64, 1)
	bDone := make(chan error, 1)
	go func() {
		_, err := b.AllocateFunc(ctx, sku, "b-1", 5, "", func(ctx context.Context) error {
			resp, err := raw.Get(ctx, a.Keys().PoolLock(sku), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				return err
			}
			poolHeld <- resp.Count
			return nil
		})
		bDone <- err
	}()
	// Let A go once B waits for the segment (its key queued behind A's),
	// so that B takes the path through the segment's lock.
	waitForCond(t, "B queued for the segment", func() bool {
		resp, err := raw.Get(ctx, a.Keys().SegmentLock(sku, 0), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count >= 2
	})
	close(release)
	if err := <-aDone; err != nil {
		t.Fatalf("A: %v", err)
	}
	if err := <-bDone; err != nil {
		t.Fatalf("B: %v", err)
	}
	if n := <-poolHeld; n != 0 {
		t.Fatalf("B's step ran with %d key(s) under the pool's lock", n)
	}
	r := mustAudit(t, a, sku)
	if r.Allocated != 6 {
		t.Fatalf("allocated %d, want 6: %+v", r.Allocated, r)
	}
}

// waitForCond polls cond until it holds, failing after a generous bound.
func waitForCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
