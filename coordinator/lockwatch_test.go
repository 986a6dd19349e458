package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// lease is the lease of c's current session.
func lease(t *testing.T, c *coordinator.Coordinator) int64 {
	t.Helper()
	sess, err := engines.Of(c).Locks.Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return int64(sess.Lease())
}

// holdSegment runs an order with a step on c that holds one segment of sku
// until release is closed; it returns once the step runs, with the segment.
func holdSegment(t *testing.T, c *coordinator.Coordinator, sku, order string, release <-chan struct{}) (seg int, done <-chan error) {
	t.Helper()
	inStep := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := c.AllocateFunc(t.Context(), sku, order, 1, "", func(context.Context) error {
			close(inStep)
			<-release
			return nil
		})
		errc <- err
	}()
	select {
	case <-inStep:
	case err := <-errc:
		t.Fatalf("the holding order failed before its step: %v", err)
	}
	held := engines.Of(c).Stock.HeldSegments(sku)
	if len(held) != 1 {
		t.Fatalf("the holding order's process holds %v, want one segment", held)
	}
	return held[0], errc
}

// The process's one watch of the lock keys breaks, and the history it
// missed is compacted away meanwhile: the watch reads every key again, and
// the process's view of who holds the SKU's segments is right again. A
// talks to one member of three; that member stops; B, on another member,
// takes a segment; history is compacted past it; the member comes back.
// A's view shows B's hold, then its release; A's orders are served
// throughout (a direct order does not need the view to be right: its
// commit compares that the segment is free), and the books balance.
func TestLockViewAfterCompaction(t *testing.T) {
	cl := etcdtest.NewCluster(t, 3, etcdtest.WithNoFsync())
	newOn := func(member int) *coordinator.Coordinator {
		c, err := coordinator.New(etcdtest.NewClient(t, cl.Member(member).Endpoints()...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := newOn(0), newOn(1)
	raw := etcdtest.NewClient(t, cl.Member(2).Endpoints()...)
	ctx := t.Context()
	mustCreate(t, b, "view", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100})
	if _, err := a.Allocate(ctx, "view", "a-0", 1, ""); err != nil {
		t.Fatal(err)
	}
	free := []int64{0, 0}
	etcdtest.WaitFor(t, "A's view of a free SKU", 30*time.Second, func() bool {
		return slices.Equal(engines.Of(a).Stock.ViewedHolders("view"), free)
	})

	cl.Stop(0)
	release := make(chan struct{})
	seg, done := holdSegment(t, b, "view", "b-0", release)
	bLease := lease(t, b)
	// History up to now goes: A's watch cannot resume where it stopped.
	put, err := raw.Put(ctx, "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Compact(ctx, put.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	cl.Restart(t, 0)

	want := []int64{0, 0}
	want[seg] = bLease
	etcdtest.WaitFor(t, "A's view to show B's hold after the compaction", time.Minute, func() bool {
		return slices.Equal(engines.Of(a).Stock.ViewedHolders("view"), want)
	})
	for i := 1; i <= 5; i++ {
		if _, err := a.Allocate(ctx, "view", fmt.Sprintf("a-%d", i), 1, ""); err != nil {
			t.Fatalf("A's order %d after the compaction: %v", i, err)
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("B's order: %v", err)
	}
	// B keeps its idle tenure until it times out; once B closes, its key
	// goes, and A sees that too.
	b.Close()
	etcdtest.WaitFor(t, "A's view to show B's segment free", time.Minute, func() bool {
		return slices.Equal(engines.Of(a).Stock.ViewedHolders("view"), free)
	})
	if rep := mustAudit(t, a, "view"); rep.Allocated != 7 {
		t.Fatalf("audit allocates %d units, want 7", rep.Allocated)
	}
}

// A process whose session is lost while it holds segments of a SKU (its
// lease revoked: its keys go with it) sees its own keys go from its view,
// sells again on a new session, and the other process's view follows: the
// old lease's keys are gone from both, the new one's appear.
func TestSessionLossWithAView(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	a, b := cs[0], cs[1]
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, a, "lost", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100})
	noop := func(context.Context) error { return nil }
	if _, err := a.AllocateFunc(ctx, "lost", "a-0", 1, "", noop); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Allocate(ctx, "lost", "b-0", 1, ""); err != nil { // B's seller and view
		t.Fatal(err)
	}
	old := lease(t, a)
	held := engines.Of(a).Stock.HeldSegments("lost")
	if len(held) != 1 {
		t.Fatalf("A holds %v, want one segment (its tenure)", held)
	}
	seg := held[0]
	shows := func(c *coordinator.Coordinator, l int64) bool {
		v := engines.Of(c).Stock.ViewedHolders("lost")
		return len(v) == 2 && v[seg] == l
	}
	etcdtest.WaitFor(t, "both views to show A's tenure", 30*time.Second, func() bool { return shows(a, old) && shows(b, old) })

	if _, err := raw.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "both views to drop the revoked lease's key", 30*time.Second, func() bool {
		return !shows(a, old) && !shows(b, old)
	})
	// A learns from the watch that its key is gone, before its session's
	// next keepalive would tell.
	etcdtest.WaitFor(t, "A to give up its tenure", 30*time.Second, func() bool {
		return len(engines.Of(a).Stock.HeldSegments("lost")) == 0
	})
	// A sells again, on a new session, and takes a segment again.
	if _, err := a.AllocateFunc(ctx, "lost", "a-1", 1, "", noop); err != nil {
		t.Fatal(err)
	}
	now := lease(t, a)
	if now == old {
		t.Fatal("A's session was not renewed")
	}
	held = engines.Of(a).Stock.HeldSegments("lost")
	if len(held) != 1 {
		t.Fatalf("A holds %v after selling again, want one segment", held)
	}
	seg = held[0]
	etcdtest.WaitFor(t, "both views to show A's new tenure", 30*time.Second, func() bool { return shows(a, now) && shows(b, now) })
	if rep := mustAudit(t, a, "lost"); rep.Allocated != 3 {
		t.Fatalf("audit allocates %d units, want 3", rep.Allocated)
	}
}
