package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// A process that keeps selling a SKU while another deletes it and creates
// it again (with fewer or more segments), or deletes it only, fails
// cleanly and reads it again: every write that moves stock compares the
// SKU's incarnation (its meta record's creation). Nothing is written
// outside the new SKU's segments, its books balance, and the stale
// process sells from it afterwards (or answers "unknown SKU" when it is
// gone), never DATA_LOSS or a false sold-out.
func TestStaleProcessAfterDeleteAndRecreate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		before     int // segments before
		after      int // segments of the new SKU; 0: not created again
		lazy       bool
		routedKeys bool
	}{
		{name: "fewer segments", before: 8, after: 2},
		{name: "more segments", before: 2, after: 8},
		{name: "deleted only", before: 8},
		{name: "fewer segments, lazy", before: 8, after: 2, lazy: true},
		{name: "more segments, lazy", before: 2, after: 8, lazy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
			var opts []coordinator.Option
			if tc.lazy {
				opts = append(opts, coordinator.WithLazySegments())
			} else {
				opts = append(opts, coordinator.WithEagerSegments())
			}
			stale := newCoordinators(t, etcd, 1, opts...)[0]
			admin := newCoordinator(t, etcd)
			raw := etcd.Client(t)
			ctx := t.Context()
			k := engines.Of(admin).Keys
			// Most of the stock in the pool, so that the seller pulls
			// from it into segments (the moves a stale view got wrong).
			mustCreate(t, stale, "dr", coordinator.SKUConfig{Total: 400, Segments: tc.before, InitialFill: 4 * int64(tc.before), RefillBatch: 2})

			// The stale process sells on throughout, one order at a time
			// (a SKU it sells now and then: it takes no segment lock, so
			// the delete goes through, as in the report), pulling from
			// the pool into segments as they run dry.
			stop := make(chan struct{})
			var paused atomic.Bool
			var inOrder atomic.Int64
			var served, unknown, conflict atomic.Int64
			var wg sync.WaitGroup
			var bad sync.Map
			var badSeen atomic.Bool
			for w := range 1 {
				wg.Go(func() {
					for n := 0; ; n++ {
						select {
						case <-stop:
							return
						default:
						}
						time.Sleep(2 * time.Millisecond) // pacing: a SKU sold now and then
						if paused.Load() {
							continue
						}
						inOrder.Add(1)
						_, err := stale.Allocate(ctx, "dr", fmt.Sprintf("w%d-%d", w, n), 1, fmt.Sprintf("buyer-%d", n%16))
						inOrder.Add(-1)
						switch {
						case err == nil:
							served.Add(1)
						case errors.Is(err, coordinator.ErrUnknownSKU):
							unknown.Add(1)
						case errors.Is(err, coordinator.ErrConflict), errors.Is(err, coordinator.ErrInsufficientStock):
							conflict.Add(1)
						default:
							bad.Store(err.Error(), true)
							badSeen.Store(true)
						}
					}
				})
			}
			etcdtest.WaitFor(t, "the stale process to sell", etcdtest.MinWait, func() bool { return served.Load() >= 20 })
			// Delete it from the other process (archiving its orders),
			// and create it again with another segment count, while the
			// stale process is between orders and holds no lock (as in
			// the report: its direct sales take none; a segment it grew
			// into is given back once idle).
			paused.Store(true)
			etcdtest.WaitFor(t, "the stale process to hold no lock of the SKU", etcdtest.MinWait, func() bool {
				return inOrder.Load() == 0 && countKeys(t, raw, k.StockLocks("dr")) == 0
			})
			deleteSKU(t, admin, "dr")
			if tc.after > 0 {
				mustCreate(t, admin, "dr", coordinator.SKUConfig{Total: 300, Segments: tc.after, InitialFill: 4 * int64(tc.after), RefillBatch: 2})
			}
			mark := served.Load() + unknown.Load()
			paused.Store(false)
			etcdtest.WaitFor(t, "the stale process to go on", etcdtest.MinWait, func() bool {
				return served.Load()+unknown.Load() >= mark+40 || badSeen.Load()
			})
			close(stop)
			wg.Wait()
			bad.Range(func(k, _ any) bool {
				t.Errorf("the stale process got: %v", k)
				return true
			})

			if tc.after == 0 {
				if keys := countKeys(t, raw, k.SKUStock("dr")); keys != 0 {
					t.Fatalf("%d stock keys of the deleted SKU written after the delete", keys)
				}
				if _, err := stale.Allocate(ctx, "dr", "late", 1, ""); !errors.Is(err, coordinator.ErrUnknownSKU) {
					t.Fatalf("an order of the deleted SKU: %v, want unknown SKU", err)
				}
				return
			}
			// Only the new SKU's keys, and its books balance.
			resp, err := raw.Get(ctx, k.SKUStock("dr"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range resp.Kvs {
				sk, err := k.ParseStock(string(kv.Key))
				if err != nil || sk.Index >= tc.after {
					t.Errorf("key %s outside the new SKU's %d segments", kv.Key, tc.after)
				}
			}
			for _, c := range []*coordinator.Coordinator{admin, stale} {
				if _, err := c.Status(ctx, "dr"); err != nil {
					t.Fatalf("status: %v", err)
				}
			}
			rep := mustAudit(t, admin, "dr")
			if a, err := stale.Allocate(ctx, "dr", "after", 1, ""); err != nil {
				t.Fatalf("the stale process's order after it read the SKU again: %v", err)
			} else if a.Parts[0].Place.Index() >= tc.after {
				t.Fatalf("served from %v of a SKU with %d segments", a.Parts, tc.after)
			}
			deleteSKU(t, admin, "dr")
			t.Logf("served %d, unknown %d, conflicts %d; the new SKU's audit %+v", served.Load(), unknown.Load(), conflict.Load(), rep)
		})
	}
}

// deleteSKU deletes sku, archiving its orders, retrying while orders land
// meanwhile (DeleteSKU refuses a SKU that changed while it ran).
func deleteSKU(t *testing.T, c *coordinator.Coordinator, sku string) {
	t.Helper()
	var err error
	for range 500 {
		_, err = c.DeleteSKU(context.Background(), sku)
		if err == nil || !(strings.Contains(err.Error(), "changed while it was being deleted") || strings.Contains(err.Error(), "is held by")) {
			break
		}
	}
	if err != nil {
		t.Fatalf("delete %s: %v", sku, err)
	}
}

// Many first orders of a SKU created after the process read its SKUs race
// to read its meta record: they must share one seller (a second one's
// waiters were never woken, and its orders hung).
func TestConcurrentFirstOrdersOfANewSKU(t *testing.T) {
	for round := range 5 {
		etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
		c := newCoordinators(t, etcd, 1)[0]
		admin := newCoordinator(t, etcd)
		ctx := t.Context()
		mustCreate(t, admin, "first", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
		if _, err := c.Allocate(ctx, "first", "o", 1, ""); err != nil { // c reads its SKUs now
			t.Fatal(err)
		}
		mustCreate(t, admin, "new", coordinator.SKUConfig{Total: 64, Segments: 2, InitialFill: 64})
		octx, cancel := context.WithTimeout(ctx, etcdtest.MinWait)
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Go(func() {
				_, err := c.AllocateFunc(octx, "new", fmt.Sprintf("n%d", i), 1, "", func(context.Context) error { return nil })
				if err != nil {
					t.Errorf("round %d, order %d: %v", round, i, err)
				}
			})
		}
		wg.Wait()
		cancel()
		if t.Failed() {
			return
		}
		if rep := mustAudit(t, admin, "new"); rep.Allocated != 64 {
			t.Fatalf("round %d: %d allocated, want 64", round, rep.Allocated)
		}
	}
}
