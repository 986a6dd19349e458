package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Allocations whose reply is lost: the commit's reply blackholed (the call
// times out), the connection cut as the reply arrives, or the caller's ctx
// cancelled at a random moment while the allocation (plain, group-committed;
// or with a business step) is being committed.
//
// Invariants: retrying each order with the same ID reports the true outcome
// (Replayed exactly when etcd had recorded the first attempt, with the same
// parts); every order ends recorded exactly once; the stock went down by
// exactly the orders' quantities (nothing deducted twice, nothing lost); the
// books balance. The network faults must have lost the reply of at least one
// applied commit, or they were not injected where intended.
func TestLostReplies(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	proxy := etcdtest.NewProxy(t, etcd.Endpoints()[0])
	const sku, total = "retries", 100_000
	direct := newCoord(t, etcd.Endpoints())
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	if _, err := direct.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: total, Segments: 4, InitialFill: total}); err != nil {
		t.Fatal(err)
	}

	type attempt func(ctx context.Context, order string, qty int64) error
	netFault := func(fault func()) attempt {
		return func(ctx context.Context, order string, qty int64) error {
			// A client of its own per order: a connection that lost bytes
			// can stay stuck for a while after healing, which is not what
			// this test is about.
			// Its lock cleanup, stuck behind the fault, gives up its first
			// try quickly and goes on in the background.
			c := newCoord(t, []string{proxy.Endpoint()}, coordinator.WithReleaseTimeout(200*time.Millisecond))
			// Closed once the fault is healed (deferred first, so it runs
			// last): Close waits for its committer, so no commit of this
			// attempt is still on its way when the test reads etcd's
			// truth. (Before, a commit held back on a busy machine landed
			// after settle's quiet window: the retry said replayed, the
			// record had been read as absent.)
			defer c.Close()
			actx, acancel := context.WithTimeout(ctx, 2*time.Second)
			defer acancel()
			defer proxy.Heal()
			_, err := c.AllocateFunc(actx, sku, order, qty, order, func(context.Context) error {
				fault() // the commit goes out next; its reply will be lost
				return nil
			})
			return err
		}
	}
	// The cancelled orders' coordinator, one per case, closed before etcd's
	// truth is read: Close waits for its committer, so no commit handed
	// over before a cancel is still on its way in this process then.
	var canceller *coordinator.Coordinator
	cancelAt := func(step bool) attempt {
		return func(ctx context.Context, order string, qty int64) error {
			actx, acancel := context.WithCancel(ctx)
			time.AfterFunc(time.Duration(rand.Int64N(int64(60*time.Millisecond))), acancel)
			defer acancel()
			if step {
				_, err := canceller.AllocateFunc(actx, sku, order, qty, order, func(context.Context) error { return nil })
				return err
			}
			_, err := canceller.Allocate(actx, sku, order, qty, order)
			return err
		}
	}
	for _, tc := range []struct {
		name        string
		orders      int
		concurrent  bool
		first       attempt
		mustLoseAck bool // the fault must have lost the reply of an applied commit
	}{
		{"reply blackholed", 4, false, netFault(proxy.BlackholeReplies), true},
		{"connection cut at the reply", 6, false, netFault(proxy.CutReplies), true},
		{"ctx cancelled, group commit", 60, true, cancelAt(false), false},
		{"ctx cancelled, business step", 30, true, cancelAt(true), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := mustAudit(t, direct, sku)
			orders := make([]string, tc.orders)
			qtys := make([]int64, tc.orders)
			firstErr := make([]error, tc.orders)
			if tc.concurrent {
				canceller = newCoord(t, etcd.Endpoints())
			}
			var wg sync.WaitGroup
			for i := range orders {
				orders[i] = fmt.Sprintf("%s-%d", slug(tc.name), i)
				qtys[i] = 1 + int64(i%3)
				run := func() { firstErr[i] = tc.first(ctx, orders[i], qtys[i]) }
				if tc.concurrent {
					wg.Go(run)
				} else {
					run()
				}
			}
			wg.Wait()
			if canceller != nil {
				// Commits handed over before a cancel finish, or are
				// dropped, before Close returns.
				canceller.Close()
				canceller = nil
			}
			// Let what reached etcd be applied: once its revision stays
			// put, etcd's state is the first attempts' truth.
			settle(t, direct)
			var failed, lostAck, notApplied int
			for i, order := range orders {
				rec, recorded := orderState(t, direct, sku, order)
				if firstErr[i] == nil {
					if !recorded {
						t.Fatalf("order %s succeeded but is not recorded", order)
					}
					continue
				}
				failed++
				if recorded {
					lostAck++
				} else {
					notApplied++
				}
				var a *coordinator.Allocation
				c := direct
				if !tc.concurrent {
					c = newCoord(t, []string{proxy.Endpoint()}) // through the healed proxy
				}
				if err := retry(t, "retry "+order, 30*time.Second, notStockAnswer, func(ctx context.Context) (err error) {
					a, err = c.Allocate(ctx, sku, order, qtys[i], order)
					return err
				}); err != nil {
					t.Fatalf("retry of %s: %v", order, err)
				}
				if a.Replayed != recorded {
					t.Fatalf("retry of %s says replayed=%v, but etcd had recorded the first attempt: %v", order, a.Replayed, recorded)
				}
				if recorded && !slices.Equal(a.Parts, rec.Parts) {
					t.Fatalf("retry of %s reports parts %v, the record says %v", order, a.Parts, rec.Parts)
				}
			}
			var want int64
			for i, order := range orders {
				rec, ok := orderState(t, direct, sku, order)
				if !ok || rec.Qty != qtys[i] {
					t.Fatalf("order %s after the retries: recorded=%v qty %d, want %d", order, ok, rec.Qty, qtys[i])
				}
				want += qtys[i]
			}
			after := mustAudit(t, direct, sku)
			took := (before.Pool + before.Segments) - (after.Pool + after.Segments)
			t.Logf("%s: %d orders, %d first attempts failed: %d had been applied (reply lost), %d had not; after the retries the stock went down by %d = the orders' %d units",
				tc.name, len(orders), failed, lostAck, notApplied, took, want)
			if took != want || after.Orders-before.Orders != int64(len(orders)) {
				t.Fatalf("stock went down by %d for orders of %d units; %d order records for %d orders",
					took, want, after.Orders-before.Orders, len(orders))
			}
			if tc.mustLoseAck && lostAck == 0 {
				t.Fatal("no applied commit lost its reply: the fault was not injected after the send")
			}
		})
	}
}

// settle waits until etcd's revision has not moved for 300 ms: whatever
// was in flight has been applied or dropped.
func settle(t testing.TB, c *coordinator.Coordinator) {
	t.Helper()
	rev := func() int64 {
		var r int64
		retry(t, "read the revision", 20*time.Second, anyErr, func(ctx context.Context) error {
			resp, err := c.Client().Get(ctx, "e2e-revision")
			if err == nil {
				r = resp.Header.Revision
			}
			return err
		})
		return r
	}
	last := rev()
	etcdtest.WaitFor(t, "etcd's revision to settle", 30*time.Second, func() bool {
		time.Sleep(time.Second)
		r := rev()
		defer func() { last = r }()
		return r == last
	})
}

// slug makes a test case name usable in an order ID.
func slug(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			b[i] = '-'
		}
	}
	return string(b)
}
