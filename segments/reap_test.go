package segments

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// A SKU ordered once and then left alone costs the process nothing after a
// while: its segment is given back (TenureIdle), then its seller, lock
// queues, place caches and lock-watch entries are forgotten (SellerIdle);
// only its cached meta stays. Ordering it again works as the first time.
func TestIdleSellersAreForgotten(t *testing.T) {
	// The reaper itself would wait an hour; the test calls it with a clock
	// that far ahead once the segments are given back, so that nothing
	// here depends on the machine's speed.
	e := etcdEngine(t, func(c *engineTestConfig) { c.tenureIdle, c.sellerIdle = 100*time.Millisecond, time.Hour })
	ctx := t.Context()
	const n = 20
	for i := range n {
		if _, err := e.CreateSKU(ctx, fmt.Sprint("idle-", i), SKUConfig{Total: 10, Segments: 4, InitialFill: 10}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Allocate(ctx, fmt.Sprint("idle-", i), fmt.Sprint("o-", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.sellerCount(); got != n {
		t.Fatalf("%d sellers after the orders; want %d", got, n)
	}
	etcdtest.WaitFor(t, "the idle sellers to be forgotten", 30*time.Second, func() bool {
		e.evictIdle(time.Now().Add(2 * time.Hour))
		sellers, places, keys, queues := e.footprint()
		return sellers == 0 && places == 0 && keys == 0 && queues == 0
	})
	if _, err := e.Allocate(ctx, "idle-3", "o-again", 1, ""); err != nil {
		t.Fatalf("an order after the seller was forgotten: %v", err)
	}
	if st, err := e.Status(ctx, "idle-3"); err != nil || st.Remaining() != 8 {
		t.Fatalf("status after two orders: %+v, %v; want 8 left", st, err)
	}
}

func (e *Engine) sellerCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.sellers)
}

// footprint counts what the engine keeps per SKU: sellers, place caches,
// segment lock keys seen by the lock watch, and the lock engine's queues.
func (e *Engine) footprint() (sellers, places, keys, queues int) {
	e.mu.Lock()
	sellers, places = len(e.sellers), len(e.places)
	e.mu.Unlock()
	e.lockWatch.mu.Lock()
	keys = len(e.lockWatch.index)
	e.lockWatch.mu.Unlock()
	return sellers, places, keys, e.locks.QueueCount()
}

var _ = context.Background

// A seller makes a segment's lock queue only when it first takes or waits
// for that lock: a SKU sold only directly leaves the lock engine without a
// queue. Once forgotten, a seller makes none (a lock taken through it by a
// caller that still had it would be kept as a tenure nobody sells from).
func TestSellerMakesLockQueuesOnUse(t *testing.T) {
	e := etcdEngine(t, func(c *engineTestConfig) { c.sellerIdle = time.Hour })
	ctx := t.Context()
	if _, err := e.CreateSKU(ctx, "lazyq", SKUConfig{Total: 40, Segments: 4, InitialFill: 40}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Allocate(ctx, "lazyq", "o-1", 1, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, _, queues := e.footprint(); queues != 0 || len(e.HeldSegments("lazyq")) != 0 {
		t.Fatalf("after a direct order: %d lock queues, held %v; want none", queues, e.HeldSegments("lazyq"))
	}
	s := testSeller(t, e, "lazyq")
	q, err := s.queue(2)
	if err != nil || q == nil {
		t.Fatalf("queue 2: %v, %v", q, err)
	}
	if again, _ := s.queue(2); again != q {
		t.Fatal("a second call made another queue")
	}
	if _, _, _, queues := e.footprint(); queues != 1 {
		t.Fatalf("%d lock queues after one was made; want 1", queues)
	}
	s.release()
	e.evictIdle(time.Now().Add(2 * time.Hour))
	if _, _, _, queues := e.footprint(); queues != 0 {
		t.Fatalf("%d lock queues after the seller was forgotten; want 0", queues)
	}
	if q, err := s.queue(1); !errors.Is(err, errSellerReaped) || q != nil {
		t.Fatalf("a forgotten seller's queue: %v, %v; want errSellerReaped", q, err)
	}
	if _, _, _, queues := e.footprint(); queues != 0 {
		t.Fatalf("%d lock queues made by a forgotten seller; want 0", queues)
	}
}

// testSeller is e's seller of sku (the caller releases it).
func testSeller(t *testing.T, e *Engine, sku string) *seller {
	t.Helper()
	info, err := e.sku(t.Context(), sku)
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.seller(info)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
