package rebalance_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// The SKUs createDrySKUs makes: dryTotal units, dryFill of them over 4
// segments (2 each, below the watermark of 5), the rest in the pool.
const dryTotal, dryFill = 100, 8

// createDrySKUs creates n SKUs (prefix0, prefix1, …) of 4 segments whose
// every segment starts below its watermark, the rest in the pool: a new
// leader's first pass refills them all. It creates 16 at a time.
func createDrySKUs(tb testing.TB, c *coordinator.Coordinator, prefix string, n int) []string {
	tb.Helper()
	names := make([]string, n)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				names[i] = fmt.Sprintf("%s%d", prefix, i)
				if _, err := c.CreateSKU(tb.Context(), names[i], coordinator.SKUConfig{Total: dryTotal, Segments: 4,
					InitialFill: dryFill, LowWatermark: 5, RefillBatch: 10}); err != nil {
					tb.Errorf("create %s: %v", names[i], err)
					return
				}
			}
		})
	}
	wg.Wait()
	if tb.Failed() {
		tb.FailNow()
	}
	return names
}

// refilledSKUs is the set of SKUs some move of log refilled.
func refilledSKUs(log *moveLog) map[string]bool {
	got := map[string]bool{}
	for _, m := range log.snapshot() {
		if m.Kind == rebalance.Refill {
			got[m.SKU] = true
		}
	}
	return got
}

// poolsLostTheirRefills checks that each of the SKUs createDrySKUs made
// balances and that its pool lost exactly what log's refills moved out of it
// (a move committed twice, or committed and not reported, breaks that).
// Stop the rebalancers first: a refill committed after log is read would
// look like stock gone missing.
func poolsLostTheirRefills(t *testing.T, c *coordinator.Coordinator, names []string, log *moveLog) {
	t.Helper()
	refilled := map[string]int64{}
	for _, m := range log.snapshot() {
		if m.Kind == rebalance.Refill {
			refilled[m.SKU] += m.Qty
		}
	}
	for _, sku := range names {
		want := dryTotal - dryFill - refilled[sku]
		if got := audit(t, c, sku).Pool; got != want {
			t.Fatalf("%s: pool %d after logged refills of %d, want %d", sku, got, refilled[sku], want)
		}
	}
}

// A leader whose session ends in the middle of its first pass over many
// SKUs stops (its moves are fenced by its leadership: none commits after
// the revoke), and the next leader refills the rest; every SKU's pool lost
// exactly what the logged refills moved.
func TestLeaderLostInTheMiddleOfAPass(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c0 := newCoordinator(t, etcd, coordinator.WithSessionTTL(2*time.Second))
	c1 := newCoordinator(t, etcd, coordinator.WithSessionTTL(2*time.Second))
	names := createDrySKUs(t, c0, "lost-", 150)

	var log moveLog
	var once sync.Once
	revoked := make(chan int64, 1)
	r0, stop0 := startRebalancer(t, c0, rebalance.Config{Identity: "r0", OnMove: func(m rebalance.Move) {
		log.add(m)
		if len(log.snapshot()) == 20 {
			once.Do(func() {
				// Revoke the leader's session in the middle of its pass,
				// before its next move (OnMove runs inside the pass).
				sess, err := engines.Of(c0).Locks.Session(t.Context())
				if err != nil {
					t.Error(err)
					revoked <- 0
					return
				}
				resp, err := etcd.Client(t).Revoke(t.Context(), sess.Lease())
				if err != nil {
					t.Error(err)
					revoked <- 0
					return
				}
				revoked <- resp.Header.Revision
			})
		}
	}})
	etcdtest.WaitFor(t, "r0 leads", 30*time.Second, r0.Leader)
	var revokedAt int64
	select {
	case revokedAt = <-revoked:
	case <-time.After(60 * time.Second):
		t.Fatal("r0 made fewer than 20 moves")
	}
	if revokedAt == 0 {
		return
	}
	etcdtest.WaitFor(t, "r0's term over", 30*time.Second, func() bool { return !r0.Leader() })
	stop0() // r0 could be elected again on a new session: keep r1 the next leader
	_, stop1 := startRebalancer(t, c1, rebalance.Config{Identity: "r1", OnMove: log.add})
	etcdtest.WaitFor(t, "every SKU refilled", 60*time.Second, func() bool {
		return len(refilledSKUs(&log)) == len(names)
	})
	stop1()
	byR1 := 0
	for _, m := range log.snapshot() {
		if m.Leader == "r0" && m.Revision > revokedAt {
			t.Fatalf("r0 moved %+v after its session was revoked at revision %d", m, revokedAt)
		}
		if m.Leader == "r1" {
			byR1++
		}
	}
	if byR1 == 0 {
		t.Fatal("r1 made no move: r0 went on with its pass after its session was revoked")
	}
	poolsLostTheirRefills(t, c1, names, &log)
	t.Logf("r0 moved %d before its session was revoked, r1 %d", len(log.snapshot())-byR1, byR1)
}

// A SKU whose pool lock another process holds (one paused while pulling
// from the pool keeps it until its lease ends) costs the leader at most
// refillLockWait a round: every other SKU is refilled meanwhile, and the
// held one once its lock is free. Before, the leader waited for that lock,
// and every SKU after the held one with it.
func TestHeldPoolLockStallsOnlyItsSKU(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinator(t, etcd)
	names := createDrySKUs(t, c, "held-", 24)
	blocked := names[7]

	sess, err := concurrency.NewSession(etcd.Client(t), concurrency.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	poolLock := concurrency.NewMutex(sess, strings.TrimSuffix(engines.Of(c).Keys.PoolLock(blocked), "/"))
	if err := poolLock.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}

	var log moveLog
	_, stop := startRebalancer(t, c, rebalance.Config{Identity: "r", OnMove: log.add, SweepInterval: 200 * time.Millisecond})
	etcdtest.WaitFor(t, "every SKU but the held one refilled", 60*time.Second, func() bool {
		return len(refilledSKUs(&log)) == len(names)-1
	})
	if refilledSKUs(&log)[blocked] {
		t.Fatalf("%s refilled while another process held its pool lock", blocked)
	}
	if err := poolLock.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "the held SKU refilled once its lock is free", 60*time.Second, func() bool {
		return refilledSKUs(&log)[blocked]
	})
	stop()
	poolsLostTheirRefills(t, c, names, &log)
}

// Watching turns true only once a leader's first pass has acted on every
// SKU (each dry SKU is refilled by then), and false when its term ends; a
// new term watches again only after its own first pass.
func TestWatchingAfterTheFirstPass(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinator(t, etcd, coordinator.WithSessionTTL(2*time.Second))
	names := createDrySKUs(t, c, "watch-", 60)

	idle, err := rebalance.New(c, rebalance.Config{Identity: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	if idle.Watching() {
		t.Fatal("a rebalancer that never ran is watching")
	}
	var log moveLog
	r, _ := startRebalancer(t, c, rebalance.Config{Identity: "r", OnMove: log.add})
	etcdtest.WaitFor(t, "r watches", 60*time.Second, r.Watching)
	if !r.Leader() {
		t.Fatal("watching without leading")
	}
	if got := refilledSKUs(&log); len(got) != len(names) {
		t.Fatalf("watching after refilling %d of the %d dry SKUs", len(got), len(names))
	}

	// End the term: its session's lease revoked.
	sess, err := engines.Of(c).Locks.Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Client(t).Revoke(t.Context(), sess.Lease()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "r's term over", 30*time.Second, func() bool { return !r.Watching() && !r.Leader() })
	etcdtest.WaitFor(t, "r watches again, on a new session", 60*time.Second, r.Watching)
}
