package segments

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/keys"
)

// untilLooksShort's context ends when a look of the process newer than the
// order's shows less than the quantity, and not before.
func TestUntilLooksShort(t *testing.T) {
	e := etcdEngine(t)
	ctx := t.Context()
	if _, err := e.CreateSKU(ctx, "w", SKUConfig{Total: 4, Segments: 2, InitialFill: 4}); err != nil {
		t.Fatal(err)
	}
	s := testSeller(t, e, "w")
	defer s.release()
	look := func(rev, total int64) *snapshot {
		return &snapshot{rev: rev, pool: total, segs: make([]int64, 2), inbox: make([]int64, 2), inMod: make([]int64, 2)}
	}
	const own = 100 // the revision of the waiting order's own look
	cases := []struct {
		name       string
		rev, total int64 // of the look set while the wait runs
		qty        int64
		ends       bool
	}{
		{"enough left", own + 1, 3, 2, false},
		{"exactly enough", own + 1, 2, 2, false},
		{"too little", own + 1, 1, 2, true},
		{"sold out", own + 5, 0, 1, true},
		{"too little, but older than the order's look", own - 1, 1, 2, false},
		{"too little, as of the order's look", own, 0, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s.setLook(look(own, 100))
			waitCtx, stop := s.untilLooksShort(ctx, tc.qty, own)
			defer stop()
			s.setLook(look(tc.rev, tc.total))
			if tc.ends {
				select {
				case <-waitCtx.Done():
				case <-time.After(etcdtest.MinWait):
					t.Fatalf("a look of %d did not end the wait of an order of %d within %v", tc.total, tc.qty, etcdtest.MinWait)
				}
				if cause := context.Cause(waitCtx); !errors.Is(cause, errLooksShort) {
					t.Fatalf("the wait ended with %v, want errLooksShort", cause)
				}
				return
			}
			// One more look of the same kind: the wait must still run.
			done := s.nextLook()
			s.setLook(look(tc.rev, tc.total))
			<-done
			if err := waitCtx.Err(); err != nil {
				t.Fatalf("a look of %d at revision %d ended the wait of an order of %d (its own look at %d): %v",
					tc.total, tc.rev, tc.qty, own, context.Cause(waitCtx))
			}
		})
	}
}

// Invariant: an order waiting at rung 5 for a lock another process holds
// is answered once another order of its process finds the SKU sold out
// for it, without waiting for the lock: the answer (here a refusal) comes
// from its own fresh look. Before, it waited out FallbackWait (here ten
// minutes) or the other holder, whichever ended first: at the end of a
// fragmented sale a third to a half of the sale's wall time went on
// buyers waiting for segments that had emptied meanwhile.
func TestRungFiveWaitEndsWhenALookSeesTooLittle(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := etcd.Client(t)
	raw := etcd.Client(t)
	e := etcdEngine(t, func(c *engineTestConfig) { c.client = client })
	e.cfg.FallbackWait = 10 * time.Minute
	ctx := t.Context()
	const sku = "ending"
	// One unit in each of two segments.
	if _, err := e.CreateSKU(ctx, sku, SKUConfig{Total: 2, Segments: 2, InitialFill: 2}); err != nil {
		t.Fatal(err)
	}
	// Another process holds segment 0 and never lets go (a lock key of its
	// lease, put by hand: it sells nothing, as a holder busy elsewhere).
	lease, err := raw.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	lockPfx := e.placeLock(sku, Segment(0))
	if _, err := raw.Put(ctx, keys.ExclusiveWaiter(lockPfx, int64(lease.ID)), "other", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}

	// An order for both units: no place holds two, so it gathers, and
	// waits for segment 0's lock.
	type outcome struct {
		a   *Allocation
		err error
	}
	waiting := make(chan outcome, 1)
	go func() {
		a, err := e.Allocate(ctx, sku, "both", 2, "")
		waiting <- outcome{a, err}
	}()
	deadline := time.Now().Add(etcdtest.MinWait)
	for {
		resp, err := raw.Get(ctx, lockPfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the order of 2 did not queue for segment 0's lock within %v", etcdtest.MinWait)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Another order takes segment 1's unit; a third order of 2 looks and is
	// refused: one unit is left, behind the other holder.
	if _, err := e.Allocate(ctx, sku, "one", 1, ""); err != nil {
		t.Fatal(err)
	}
	var short *InsufficientStockError
	if _, err := e.Allocate(ctx, sku, "two-more", 2, ""); !errors.As(err, &short) || short.Remaining != 1 {
		t.Fatalf("an order of 2 with 1 unit left: %v, want an insufficient-stock refusal with 1 remaining", err)
	}

	select {
	case r := <-waiting:
		if !errors.As(r.err, &short) || short.Remaining != 1 {
			t.Fatalf("the waiting order of 2: %+v, %v; want an insufficient-stock refusal with 1 remaining", r.a, r.err)
		}
	case <-time.After(etcdtest.MinWait):
		t.Fatalf("the waiting order of 2 was not answered within %v of a look that saw 1 unit left (its lock wait runs 10 minutes)", etcdtest.MinWait)
	}
	// Nothing of this process stays queued behind the other holder (a
	// background claim of the segment may, for its ClaimWait).
	for deadline := time.Now().Add(etcdtest.MinWait); ; {
		resp, err := raw.Get(ctx, lockPfx, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == "other" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("segment 0's lock keys %v after %v; want only the other holder's", resp.Kvs, etcdtest.MinWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := raw.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	rep, err := e.Audit(ctx, sku)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Allocated != 1 {
		t.Fatalf("audit %+v; want the books balanced with 1 allocated", rep)
	}
}
