package e2e

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
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

// Reservations expiring while the leading rebalancer's process is SIGKILLed
// in the middle of a sale (once it has expired 20 reservations, with more
// expiring all the time; buyers reaching half the stock wait for the
// second rebalancer to lead, so that both have reservations to expire). Buyers on two coordinators reserve
// 1–2 units with TTLs of 300–650 ms, never pay 30% of them and confirm the
// rest at once; a per-user limit holds. A second rebalancer waits in the
// election.
//
// Invariants:
//   - every reservation never paid expires exactly once in etcd's history;
//     none that was confirmed ever expires;
//   - every expiry by a sweep was committed while its rebalancer led the
//     election (the sweep is fenced by the leadership): the killed leader's
//     last sweeps and its successor's never overlap;
//   - the books balance at every revision that expired a reservation
//     (AuditAt: pool, segments, confirmed and reserved orders, index keys,
//     buyer counters);
//   - expired stock is sold again: the sale ends with the whole total
//     confirmed.
func TestExpiryFailover(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	const sku, total = "exp", 800
	opts := []coordinator.Option{coordinator.WithSessionTTL(ttl)}
	admin := newCoord(t, etcd.Endpoints(), opts...)
	// A bound against a hang, not a speed target: the test took 121 s
	// beside four busy loops (load 16) and ran out of a 2-minute budget.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	if _, err := admin.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: total, Segments: 6, InitialFill: 120,
		LowWatermark: 5, RefillBatch: 20, PerUserLimit: 4}); err != nil {
		t.Fatal(err)
	}
	created, err := admin.Client().Get(ctx, "e2e-revision")
	if err != nil {
		t.Fatal(err)
	}
	from := created.Header.Revision + 1

	const first, second = "rebalancer-1", "rebalancer-2"
	helper := startHelper(t, helperConfig{Mode: "rebalance", Endpoints: etcd.Endpoints(), TTLSec: int(ttl / time.Second), Identity: first})
	etcdtest.WaitFor(t, "the helper's rebalancer to lead", 60*time.Second, func() bool { return helper.count("LEADER true") == 1 })
	r2, stop2 := startRebalancer(t, newCoord(t, etcd.Endpoints(), opts...), rebalance.Config{Identity: second, SweepInterval: 200 * time.Millisecond})

	sellers := []*coordinator.Coordinator{newCoord(t, etcd.Endpoints(), opts...), newCoord(t, etcd.Endpoints(), opts...)}
	var mu sync.Mutex
	confirmed := map[string]bool{}
	abandoned := map[string]bool{}
	selfExpired := map[string]bool{} // expired by a Confirm that came too late, not by a sweep
	var sold atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			c := sellers[g%2]
			for n := 0; n < 600 && sold.Load() < total && ctx.Err() == nil; n++ {
				// Held at half the stock until the second rebalancer leads,
				// so that both leaders have reservations to expire.
				for sold.Load() >= total/2 && !r2.Leader() && ctx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
				id := fmt.Sprintf("e%d-%d", g, n)
				buyer := fmt.Sprintf("b%d-%d", g, n/2)
				qty := int64(1 + n%2)
				ttl := time.Duration(300+50*(n%8)) * time.Millisecond
				_, err := c.Reserve(ctx, sku, id, qty, buyer, ttl, coordinator.WithBuyer(buyer))
				switch {
				case errors.Is(err, coordinator.ErrLimitExceeded):
					continue
				case errors.Is(err, coordinator.ErrInsufficientStock):
					time.Sleep(20 * time.Millisecond) // expiries will give stock back
					continue
				case err != nil && notStockAnswer(err):
					// A lost reply or lock: a retry under the same ID tells.
					_, err = c.Reserve(ctx, sku, id, qty, buyer, ttl, coordinator.WithBuyer(buyer))
				}
				if err != nil {
					t.Errorf("reserve %s: %v", id, err)
					return
				}
				if n%10 < 3 {
					mu.Lock()
					abandoned[id] = true
					mu.Unlock()
					continue
				}
				_, err = c.Confirm(ctx, sku, id)
				mu.Lock()
				switch {
				case err == nil:
					sold.Add(qty)
					confirmed[id] = true
				case errors.Is(err, coordinator.ErrExpired):
					selfExpired[id] = true
				default:
					t.Errorf("confirm %s: %v", id, err)
				}
				mu.Unlock()
			}
		})
	}
	etcdtest.WaitFor(t, "20 reservations expired by the first rebalancer", 60*time.Second, func() bool {
		r, err := admin.Audit(ctx, sku)
		return err == nil && r.ExpiredOrders >= 20
	})
	faultAt := helper.kill(t)
	etcdtest.WaitFor(t, "the second rebalancer to lead", 30*time.Second, r2.Leader)
	took := time.Since(faultAt)
	wg.Wait()
	if t.Failed() {
		return
	}
	etcdtest.WaitFor(t, "every live reservation to expire", 30*time.Second, func() bool {
		st, err := admin.Status(ctx, sku)
		return err == nil && st.Reservations == 0
	})
	stop2()

	hist := expiriesInHistory(t, admin, sku, from)
	byLeader := map[string]int{}
	for id := range abandoned {
		if n := len(hist[id]); n != 1 {
			t.Errorf("abandoned reservation %s expired %d times in etcd's history, want 1", id, n)
		}
	}
	for id := range confirmed {
		if len(hist[id]) > 0 {
			t.Errorf("confirmed reservation %s expired at %v", id, hist[id])
		}
	}
	revs := map[int64]bool{}
	for id, rs := range hist {
		for _, rev := range rs {
			revs[rev] = true
			if selfExpired[id] {
				continue
			}
			leader := leaderAt(t, admin, rev)
			if leader != first && leader != second {
				t.Errorf("%s expired at revision %d while %q led the election", id, rev, leader)
			}
			byLeader[leader]++
		}
	}
	for rev := range revs {
		r, err := admin.AuditAt(ctx, sku, rev)
		if err != nil {
			t.Fatalf("books at revision %d (an expiry): %v", rev, err)
		}
		if !r.OK {
			t.Fatalf("books at revision %d (an expiry): %v", rev, r.Problems)
		}
	}
	rep := mustAudit(t, admin, sku)
	if sold.Load() != total || rep.Confirmed != total || rep.Reserved != 0 {
		t.Fatalf("at the end: %d units confirmed by the buyers, audit confirmed %d reserved %d; want the total %d", sold.Load(), rep.Confirmed, rep.Reserved, total)
	}
	if byLeader[first] == 0 || byLeader[second] == 0 {
		t.Errorf("expiries by leader: %v; want expiries by both, before and after the kill", byLeader)
	}
	t.Logf("new leader %v after the SIGKILL; %d abandoned reservations expired exactly once (%d by %s, %d by %s), %d expired by a late confirm; %d units confirmed; audit %+v",
		took.Round(time.Millisecond), len(abandoned), byLeader[first], first, byLeader[second], second, len(selfExpired), sold.Load(), *rep)
}

// expiriesInHistory returns, for each order of sku, the revisions of etcd's
// history (from revision from) that turned it expired.
func expiriesInHistory(t testing.TB, c *coordinator.Coordinator, sku string, from int64) map[string][]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := engines.Of(c).Keys
	sentinel := k.Prefix() + "e2e-expiry-history-end/" + sku
	if _, err := c.Client().Put(ctx, sentinel, ""); err != nil {
		t.Fatal(err)
	}
	out := map[string][]int64{}
	prev := map[string]segments.OrderState{}
	for wr := range c.Client().Watch(ctx, k.Prefix(), clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if err := wr.Err(); err != nil {
			t.Fatalf("history watch: %v", err)
		}
		for _, ev := range wr.Events {
			key := string(ev.Kv.Key)
			if key == sentinel {
				return out
			}
			if !strings.HasPrefix(key, k.Orders(sku)) {
				continue
			}
			o, err := segments.DecodeOrder(key, ev.Kv.Value)
			if err != nil {
				t.Fatalf("history: %v", err)
			}
			if o.State == segments.StateExpired && prev[o.ID] != segments.StateExpired {
				out[o.ID] = append(out[o.ID], ev.Kv.ModRevision)
			}
			prev[o.ID] = o.State
		}
	}
	t.Fatal("history watch ended before its sentinel")
	return nil
}
