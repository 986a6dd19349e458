package rebalance_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// createDrySKUs creates n SKUs (prefix0, prefix1, …) of 4 segments whose
// every segment starts below its watermark, the rest in the pool: a new
// leader's first pass refills them all.
func createDrySKUs(t *testing.T, c *coordinator.Coordinator, prefix string, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", prefix, i)
		if _, err := c.CreateSKU(t.Context(), names[i], coordinator.SKUConfig{Total: 100, Segments: 4,
			InitialFill: 8, LowWatermark: 5, RefillBatch: 10}); err != nil {
			t.Fatal(err)
		}
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

// A leader whose session ends in the middle of its first pass over many
// SKUs stops (its moves are fenced by its leadership: none commits after
// the revoke), and the next leader refills the rest; every SKU's pool lost
// exactly what the logged refills moved (a move committed twice, or
// committed and not reported, would break that).
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
	for _, sku := range names {
		rep := audit(t, c1, sku)
		var in int64
		for _, m := range log.snapshot() {
			if m.SKU == sku && m.Kind == rebalance.Refill {
				in += m.Qty
			}
		}
		if rep.Pool != 92-in {
			t.Fatalf("%s: pool %d after logged refills of %d, want %d", sku, rep.Pool, in, 92-in)
		}
	}
	t.Logf("r0 moved %d before its session was revoked, r1 %d", len(log.snapshot())-byR1, byR1)
}
