package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// stockAt is what a SKU held in all (pool, counters, inboxes) at revision
// rev, read from etcd's history.
func stockAt(t *testing.T, raw *clientv3.Client, prefix, sku string, rev int64) int64 {
	t.Helper()
	resp, err := raw.Get(t.Context(), prefix+"stock/"+sku+"/", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatalf("read %s at revision %d: %v", sku, rev, err)
	}
	var sum int64
	for _, kv := range resp.Kvs {
		v, err := segments.DecodeCounter(string(kv.Key), kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// refusal is one refusal as its caller saw it: the revision etcd was at
// before the call, and the refusal's error.
type refusal struct {
	start int64
	err   *coordinator.InsufficientStockError
}

// Invariant: a refusal is true at a revision no older than its request's
// start, while releases and restocks race the storm of orders across
// processes. A 30-unit SKU sells out under 3 coordinators × 20 goroutines
// ordering flat out; meanwhile served orders are released (from another
// coordinator) and units restocked. Every refusal, checked against etcd's
// history: its revision is at or after a linearizable read made just
// before the call, and at that revision the SKU held exactly what the
// refusal says, less than wanted. The books balance at the end.
//
// With lazy segments (WithLazySegments) too, where the SKU's units at a
// revision are counted by AuditAt (a lazy counter's N is only an upper
// bound). A lazy counter whose N is 0 is taken by a lock holder unmarked,
// inbox and all; its owner absorbing that inbox beside the holder made the
// holder's order fail ("stock changed under the lock"), 2 runs of 8,
// until an absorbing lazy commit compared the lock's range empty too.
func TestRefusalsTrueWhileReleasesRace(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(map[bool]string{false: "eager", true: "lazy"}[lazy], func(t *testing.T) {
			var opts []coordinator.Option
			if lazy {
				opts = append(opts, coordinator.WithLazySegments())
			} else {
				opts = append(opts, coordinator.WithEagerSegments())
			}
			refusalsTrueWhileReleasesRace(t, lazy, opts...)
		})
	}
}

func refusalsTrueWhileReleasesRace(t *testing.T, lazy bool, opts ...coordinator.Option) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 4, opts...)
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, cs[0], "storm", coordinator.SKUConfig{Total: 30, Segments: 4, InitialFill: 10, RefillBatch: 2, LowWatermark: 1})

	var (
		mu       sync.Mutex
		refusals []refusal
		served   []string
	)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := range 60 {
		wg.Go(func() {
			c := cs[g%3]
			for n := 0; !stop.Load(); n++ {
				now, err := raw.Get(ctx, "storm-now", clientv3.WithCountOnly())
				if err != nil {
					t.Error(err)
					return
				}
				order := fmt.Sprintf("o-%d-%d", g, n)
				_, err = c.Allocate(ctx, "storm", order, 1, "")
				var ref *coordinator.InsufficientStockError
				switch {
				case err == nil:
					mu.Lock()
					served = append(served, order)
					mu.Unlock()
				case errors.As(err, &ref):
					mu.Lock()
					refusals = append(refusals, refusal{start: now.Header.Revision, err: ref})
					mu.Unlock()
				default:
					t.Errorf("order %s: %v (only a refusal may fail an order)", order, err)
					return
				}
			}
		})
	}
	// The returns: served orders released from a coordinator that sells
	// nothing, and two restocks.
	wg.Go(func() {
		r := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < 40 && !stop.Load(); i++ {
			mu.Lock()
			var order string
			if len(served) > 0 {
				k := r.IntN(len(served))
				order = served[k]
				served = append(served[:k], served[k+1:]...)
			}
			mu.Unlock()
			if order != "" {
				if _, err := cs[3].Release(ctx, "storm", order); err != nil {
					t.Errorf("release %s: %v", order, err)
				}
			}
			if i == 10 || i == 25 {
				if _, err := cs[3].Restock(ctx, "storm", fmt.Sprint("delivery-", i), 5); err != nil {
					t.Errorf("restock: %v", err)
				}
			}
			time.Sleep(time.Duration(r.IntN(5)) * time.Millisecond)
		}
		stop.Store(true)
	})
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(refusals) == 0 {
		t.Fatal("no order was refused: the storm never sold out")
	}
	untrue := 0
	for _, rf := range refusals {
		var have int64
		if lazy {
			a, err := cs[0].AuditAt(ctx, "storm", rf.err.Revision)
			if err != nil {
				t.Fatalf("audit at revision %d: %v", rf.err.Revision, err)
			}
			have = a.Pool + a.Segments
		} else {
			have = stockAt(t, raw, cs[0].Prefix(), "storm", rf.err.Revision)
		}
		if rf.err.Revision < rf.start || have != rf.err.Remaining || have >= rf.err.Want {
			untrue++
			if untrue <= 5 {
				t.Errorf("refusal judged at revision %d (the order started at %d) said %d left of %d wanted; etcd held %d then",
					rf.err.Revision, rf.start, rf.err.Remaining, rf.err.Want, have)
			}
		}
	}
	t.Logf("%d refusals checked, %d untrue; %d orders still served", len(refusals), untrue, len(served))
	mustAudit(t, cs[0], "storm")
}

// Invariant: sold out is a state, not a search, and it flips back at once:
// after a SKU sold out and every coordinator refused it, a restock that
// has returned makes the very next order on any coordinator served, not
// refused.
func TestSoldOutFlipsBackOnRestock(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 3)
	ctx := t.Context()
	mustCreate(t, cs[0], "flip", coordinator.SKUConfig{Total: 6, Segments: 3, InitialFill: 3})
	for i := range 6 {
		if _, err := cs[i%3].Allocate(ctx, "flip", fmt.Sprint("sold-", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		for i, c := range cs {
			if _, err := c.Allocate(ctx, "flip", fmt.Sprintf("refused-%d-%d", round, i), 1, ""); !errors.Is(err, coordinator.ErrInsufficientStock) {
				t.Fatalf("coordinator %d on a sold-out SKU: %v; want a refusal", i, err)
			}
		}
		if _, err := cs[round].Restock(ctx, "flip", fmt.Sprint("back-", round), 3); err != nil {
			t.Fatal(err)
		}
		for i, c := range cs {
			if _, err := c.Allocate(ctx, "flip", fmt.Sprintf("again-%d-%d", round, i), 1, ""); err != nil {
				t.Fatalf("round %d: coordinator %d right after a restock of 3: %v; want served", round, i, err)
			}
		}
	}
	mustAudit(t, cs[0], "flip")
}

var _ = context.Background
