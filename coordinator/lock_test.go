package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// newCoordinators starts n coordinators, each on its own etcd client, as n
// separate processes would be.
func newCoordinators(t *testing.T, etcd *etcdtest.Single, n int, opts ...coordinator.Option) []*coordinator.Coordinator {
	t.Helper()
	cs := make([]*coordinator.Coordinator, n)
	for i := range cs {
		c, err := coordinator.New(etcd.Client(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs
}

func readInt(t *testing.T, cli *clientv3.Client, key string) int {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	n, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// countKeys counts the keys under prefix.
func countKeys(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// Invariant: with 4 coordinators × 32 goroutines contending for one lock,
// (a) every increment made in a fenced Txn lands, and (b) a plain,
// unfenced read-modify-write under the same lock never loses an update
// while no fault is injected. Both counters must equal the number of
// critical sections entered.
func TestMutualExclusion(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 4)
	raw := etcd.Client(t)
	const perGoroutine = 5
	const fenced, plain = "/test/mutex/fenced", "/test/mutex/plain"

	var entered, fencedOK atomic.Int64
	var inside atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 4*32)
	for _, c := range cs {
		for g := 0; g < 32; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perGoroutine; i++ {
					if err := incrementUnderLock(t.Context(), c, raw, fenced, plain, &inside, &entered, &fencedOK); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := int64(4 * 32 * perGoroutine)
	if entered.Load() != want {
		t.Fatalf("entered %d critical sections, want %d", entered.Load(), want)
	}
	if got := readInt(t, raw, fenced); int64(got) != fencedOK.Load() || fencedOK.Load() != want {
		t.Fatalf("fenced counter %d, successful fenced increments %d, want %d", got, fencedOK.Load(), want)
	}
	if got := readInt(t, raw, plain); int64(got) != want {
		t.Fatalf("plain read-modify-write counter %d, want %d: an update was lost", got, want)
	}
}

func incrementUnderLock(ctx context.Context, c *coordinator.Coordinator, raw *clientv3.Client, fenced, plain string,
	inside *atomic.Int32, entered, fencedOK *atomic.Int64) error {
	l, err := c.Lock(ctx, "counter")
	if err != nil {
		return err
	}
	if n := inside.Add(1); n != 1 {
		return fmt.Errorf("%d holders inside the critical section at once", n)
	}
	entered.Add(1)
	// Fenced: read, then write only if the lock is still ours.
	resp, err := raw.Get(ctx, fenced)
	if err != nil {
		return err
	}
	n := 0
	if len(resp.Kvs) > 0 {
		n, _ = strconv.Atoi(string(resp.Kvs[0].Value))
	}
	tr, err := l.Txn(ctx).Then(clientv3.OpPut(fenced, strconv.Itoa(n+1))).Commit()
	if err != nil {
		return err
	}
	if tr.Succeeded {
		fencedOK.Add(1)
	}
	// Plain: the same without the fence.
	resp, err = raw.Get(ctx, plain)
	if err != nil {
		return err
	}
	n = 0
	if len(resp.Kvs) > 0 {
		n, _ = strconv.Atoi(string(resp.Kvs[0].Value))
	}
	if _, err := raw.Put(ctx, plain, strconv.Itoa(n+1)); err != nil {
		return err
	}
	inside.Add(-1)
	return l.Unlock(ctx)
}

// Invariant: waiters in different processes get the lock in the order they
// queued in etcd.
func TestFIFOAcrossCoordinators(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 5)
	raw := etcd.Client(t)
	ctx := t.Context()
	lockPrefix := engines.Of(cs[0]).Keys.Lock("fifo")

	first, err := cs[0].Lock(ctx, "fifo")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 1; i < len(cs); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := cs[i].Lock(ctx, "fifo")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := l.Unlock(ctx); err != nil {
				t.Error(err)
			}
		}()
		// Let waiter i queue in etcd before waiter i+1 starts.
		etcdtest.WaitFor(t, fmt.Sprintf("waiter %d to queue", i), 20*time.Second, func() bool { return countKeys(t, raw, lockPrefix) == int64(i+1) })
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if fmt.Sprint(order) != "[1 2 3 4]" {
		t.Fatalf("lock served in order %v, want [1 2 3 4]", order)
	}
}

// Invariant: goroutines of one process are served in arrival order, and the
// hold moves between them locally (same etcd key, same revision), each with a
// fencing token larger than the one before.
func TestLocalFIFOAndCohortHandoff(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	// The key is handed on locally only within the cohort's hold bound
	// (100 ms by default), counted from its first holder: queueing 8
	// goroutines took longer than that on a starved machine (a run beside
	// four busy loops), and the first handoff went back to etcd. A bound of
	// an hour makes the test about the order and the tokens, not the speed.
	c := newCoordinators(t, etcd, 1, coordinator.WithCohort(coordinator.DefaultCohortMaxHandoffs, time.Hour))[0]
	ctx := t.Context()

	first, err := c.Lock(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		i     int
		token int64
		rev   int64
	}
	results := make(chan got, 8)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Lock(ctx, "local")
			if err != nil {
				t.Error(err)
				results <- got{i: -1}
				return
			}
			results <- got{i: i, token: l.Token(), rev: l.Revision()}
			if err := l.Unlock(ctx); err != nil {
				t.Error(err)
			}
		}()
		etcdtest.WaitFor(t, "goroutine to queue", 20*time.Second, func() bool { return c.LocalWaiters("local") == i+1 })
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	last := first.Token()
	for i := 0; i < 8; i++ {
		g := <-results
		if g.i != i {
			t.Fatalf("handoff %d went to goroutine %d", i, g.i)
		}
		if g.rev != first.Revision() {
			t.Fatalf("handoff %d changed the key's revision %d -> %d: the key went back to etcd", i, first.Revision(), g.rev)
		}
		if g.token <= last {
			t.Fatalf("handoff %d: token %d, want more than the previous holder's %d", i, g.token, last)
		}
		last = g.token
	}
}

// Invariant: the cohort bound hands the lock to another process's waiter.
// With a bound of 2 handoffs, a waiter in coordinator B gets the lock after at
// most 3 holds in A even though A always has local waiters.
func TestCohortBoundLetsOtherProcessIn(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	a := newCoordinators(t, etcd, 1, coordinator.WithCohort(2, time.Hour))[0]
	b := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	lockPrefix := engines.Of(a).Keys.Lock("fair")

	held, err := a.Lock(ctx, "fair")
	if err != nil {
		t.Fatal(err)
	}
	var aHolds atomic.Int64
	var bGot atomic.Int64 // A's hold count when B got the lock
	bDone := make(chan struct{})
	go func() {
		defer close(bDone)
		l, err := b.Lock(ctx, "fair")
		if err != nil {
			t.Error(err)
			return
		}
		bGot.Store(aHolds.Load())
		_ = l.Unlock(ctx)
	}()
	etcdtest.WaitFor(t, "B to queue in etcd", 20*time.Second, func() bool { return countKeys(t, raw, lockPrefix) == 2 })

	// A's goroutines keep the local queue non-empty.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := a.Lock(ctx, "fair")
				if err != nil {
					t.Error(err)
					return
				}
				aHolds.Add(1)
				_ = l.Unlock(ctx)
			}
		}()
	}
	etcdtest.WaitFor(t, "A's goroutines to queue", 20*time.Second, func() bool { return a.LocalWaiters("fair") >= 2 })
	aHolds.Add(1)
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	<-bDone
	close(stop)
	wg.Wait()
	if got := bGot.Load(); got > 3 {
		t.Fatalf("B waited for %d holds in A; the cohort bound of 2 handoffs allows 3", got)
	}
}

// Invariant: TryLock gives up after its budget with ErrLocked, and leaves no
// key in etcd; a waiter whose ctx is cancelled leaves no key either.
func TestTryLockAndCancelLeaveNoKey(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 2)
	raw := etcd.Client(t)
	ctx := t.Context()
	lockPrefix := engines.Of(cs[0]).Keys.Lock("busy")

	held, err := cs[0].Lock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		try  func() error
		want error
	}{
		{"trylock no wait", func() error { _, err := cs[1].Lock(ctx, "busy", coordinator.TryFor(0)); return err }, coordinator.ErrLocked},
		{"trylock 200ms budget", func() error { _, err := cs[1].Lock(ctx, "busy", coordinator.TryFor(200*time.Millisecond)); return err }, coordinator.ErrLocked},
		{"same process trylock", func() error { _, err := cs[0].Lock(ctx, "busy", coordinator.TryFor(50*time.Millisecond)); return err }, coordinator.ErrLocked},
		{"lock with deadline", func() error {
			dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			_, err := cs[1].Lock(dctx, "busy")
			return err
		}, context.DeadlineExceeded},
		{"lock cancelled", func() error {
			cctx, cancel := context.WithCancel(ctx)
			go func() {
				// Cancel once the waiter's key is in etcd (polled without t:
				// this is not the test goroutine).
				for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					if r, err := raw.Get(ctx, lockPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil && r.Count == 2 {
						break
					}
				}
				cancel()
			}()
			_, err := cs[1].Lock(cctx, "busy")
			return err
		}, context.Canceled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.try(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if n := countKeys(t, raw, lockPrefix); n != 1 {
				t.Fatalf("%d keys under the lock prefix after giving up, want only the holder's", n)
			}
		})
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The lock is free: TryLock with no wait succeeds at once.
	l, err := cs[1].Lock(ctx, "busy", coordinator.TryFor(0))
	if err != nil {
		t.Fatalf("TryLock of a free lock: %v", err)
	}
	_ = l.Unlock(ctx)
	if n := countKeys(t, raw, lockPrefix); n != 0 {
		t.Fatalf("%d keys left after the last unlock", n)
	}
}

// Invariant: a reentrant hold is released only by its last unlock; a
// repeated or stale unlock is rejected and releases nobody else's hold.
func TestReentrancyAndStaleUnlock(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 2)
	raw := etcd.Client(t)
	ctx := t.Context()
	lockPrefix := engines.Of(cs[0]).Keys.Lock("re")

	outer, err := cs[0].Lock(ctx, "re")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := cs[0].Lock(outer.Context(), "re")
	if err != nil {
		t.Fatalf("reentrant lock: %v", err)
	}
	bound, cancel := outer.Bind(ctx)
	innermost, err := cs[0].Lock(bound, "re")
	cancel()
	if err != nil {
		t.Fatalf("reentrant lock through Bind: %v", err)
	}
	if inner.Token() != outer.Token() || innermost.Token() != outer.Token() {
		t.Fatal("reentrant handles have different tokens")
	}
	if err := innermost.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := innermost.Unlock(ctx); !errors.Is(err, coordinator.ErrNotHeld) {
		t.Fatalf("second unlock of the same handle: %v, want ErrNotHeld", err)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Depth 1 left: the lock is still held.
	if tr, err := outer.Txn(ctx).Commit(); err != nil || !tr.Succeeded {
		t.Fatalf("fenced txn after inner unlocks: succeeded=%v err=%v, want held", tr != nil && tr.Succeeded, err)
	}
	if _, err := cs[1].Lock(ctx, "re", coordinator.TryFor(0)); !errors.Is(err, coordinator.ErrLocked) {
		t.Fatalf("other process TryLock while held: %v, want ErrLocked", err)
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-outer.Done():
	default:
		t.Fatal("Done not closed after the last unlock")
	}
	if !errors.Is(outer.Err(), coordinator.ErrNotHeld) {
		t.Fatalf("Err after unlock: %v", outer.Err())
	}

	// A new holder in the same process, then stale unlocks of old handles.
	next, err := cs[0].Lock(ctx, "re")
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]*coordinator.Lock{"outer": outer, "inner": inner, "innermost": innermost} {
		if err := h.Unlock(ctx); !errors.Is(err, coordinator.ErrNotHeld) {
			t.Fatalf("stale unlock of %s: %v, want ErrNotHeld", name, err)
		}
	}
	if _, err := cs[0].Lock(outer.Context(), "re"); err == nil {
		t.Fatal("re-entering through a released hold's context succeeded")
	}
	if tr, err := next.Txn(ctx).Commit(); err != nil || !tr.Succeeded {
		t.Fatal("the new holder lost the lock to a stale unlock")
	}
	if n := countKeys(t, raw, lockPrefix); n != 1 {
		t.Fatalf("%d keys, want the new holder's", n)
	}
	_ = next.Unlock(ctx)
}

// Invariant: when the lease is revoked from outside, the holder's Done
// fires, its fenced write fails, a waiter in another process acquires, and
// the first coordinator works again on a new session.
func TestLeaseRevokedWhileHolding(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 2, coordinator.WithSessionTTL(2*time.Second))
	raw := etcd.Client(t)
	ctx := t.Context()

	held, err := cs[0].Lock(ctx, "revoke")
	if err != nil {
		t.Fatal(err)
	}
	// A local waiter behind the holder, and a waiter in another process.
	localErr := make(chan error, 1)
	go func() {
		l, err := cs[0].Lock(ctx, "revoke")
		if err == nil {
			_ = l.Unlock(ctx)
		}
		localErr <- err
	}()
	etcdtest.WaitFor(t, "local waiter", 20*time.Second, func() bool { return cs[0].LocalWaiters("revoke") == 1 })
	other := make(chan *coordinator.Lock, 1)
	go func() {
		l, err := cs[1].Lock(ctx, "revoke")
		if err != nil {
			t.Error(err)
		}
		other <- l
	}()
	etcdtest.WaitFor(t, "remote waiter", 20*time.Second, func() bool { return countKeys(t, raw, engines.Of(cs[0]).Keys.Lock("revoke")) == 2 })

	if _, err := raw.Revoke(ctx, held.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not fire after the lease was revoked")
	}
	if !errors.Is(held.Err(), coordinator.ErrLockLost) {
		t.Fatalf("Err = %v, want ErrLockLost", held.Err())
	}
	if err := <-localErr; !errors.Is(err, coordinator.ErrSessionLost) {
		t.Fatalf("local waiter got %v, want ErrSessionLost", err)
	}
	tr, err := held.Txn(ctx).Then(clientv3.OpPut("/test/revoke/data", "stale")).Commit()
	if err != nil || tr.Succeeded {
		t.Fatalf("fenced write after the loss: succeeded=%v err=%v, want rejected", tr != nil && tr.Succeeded, err)
	}
	l2 := <-other
	if l2 == nil {
		t.FailNow()
	}
	if tr, err := l2.Txn(ctx).Then(clientv3.OpPut("/test/revoke/data", "fresh")).Commit(); err != nil || !tr.Succeeded {
		t.Fatalf("the new holder's fenced write: %v", err)
	}
	if err := held.Unlock(ctx); !errors.Is(err, coordinator.ErrLockLost) {
		t.Fatalf("unlock of a lost lock: %v, want ErrLockLost", err)
	}
	_ = l2.Unlock(ctx)

	// One expiry is not a permanent failure.
	again, err := cs[0].Lock(ctx, "revoke")
	if err != nil {
		t.Fatalf("lock after the session was lost: %v", err)
	}
	if again.Lease() == held.Lease() {
		t.Fatal("the coordinator reused the revoked lease")
	}
	if tr, err := again.Txn(ctx).Commit(); err != nil || !tr.Succeeded {
		t.Fatal("fenced txn on the new session failed")
	}
	_ = again.Unlock(ctx)
}

// Invariant: Unlock of a hold whose etcd key vanished before the process
// noticed (its lease expired during a pause, or the key was deleted) says
// the lock was lost (ErrLockLost), instead of reporting a clean release of
// a critical section that another process may have entered meanwhile.
func TestUnlockAfterUnnoticedLoss(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 2)
	raw := etcd.Client(t)
	ctx := t.Context()

	held, err := cs[0].Lock(ctx, "unnoticed")
	if err != nil {
		t.Fatal(err)
	}
	// What a lease expiry does to the key, without the session noticing.
	if _, err := raw.Delete(ctx, held.Key()); err != nil {
		t.Fatal(err)
	}
	other, err := cs[1].Lock(ctx, "unnoticed")
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Unlock(ctx); !errors.Is(err, coordinator.ErrLockLost) {
		t.Fatalf("Unlock after the key vanished: %v, want ErrLockLost", err)
	}
	if tr, err := other.Txn(ctx).Commit(); err != nil || !tr.Succeeded {
		t.Fatalf("the other holder lost its lock to the stale unlock (err %v)", err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatalf("a normal unlock: %v", err)
	}
	// The process's own queue is usable again.
	again, err := cs[0].Lock(ctx, "unnoticed")
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Invariant: a holder that vanishes without unlocking blocks others only
// until its lease expires. The holder reaches etcd through a proxy that is
// then blackholed: like a crashed or partitioned process, it can neither
// renew nor revoke its lease. (Closing its client is not a crash: the
// coordinator revokes the lease when it sees its session end.)
func TestOrphanedHolderFreedAfterTTL(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	const ttl = 2 * time.Second
	proxy := etcdtest.NewProxy(t, etcd.Endpoints()[0])
	cut, err := clientv3.New(clientv3.Config{Endpoints: []string{proxy.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cut.Close() })
	orphan, err := coordinator.New(cut, coordinator.WithSessionTTL(ttl), coordinator.WithReleaseTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { orphan.Close() })
	survivor := newCoordinators(t, etcd, 1, coordinator.WithSessionTTL(ttl))[0]
	ctx := t.Context()

	held, err := orphan.Lock(ctx, "orphan")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole()
	cutAt := time.Now()

	l, err := survivor.Lock(ctx, "orphan")
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(cutAt)
	t.Logf("lock freed %v after the holder was cut off (TTL %v)", waited.Round(time.Millisecond), ttl)
	if waited < ttl/2 {
		t.Fatalf("acquired after %v: the orphan's lease cannot have expired yet", waited)
	}
	select {
	case <-held.Done():
	case <-time.After(2 * ttl):
		t.Fatal("the cut-off holder was never told it lost the lock")
	}
	_ = l.Unlock(ctx)
}

// Invariant: Close releases every lock and revokes the lease; waiters fail
// with ErrClosed; later calls fail with ErrClosed.
func TestCloseReleasesEverything(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 2)
	raw := etcd.Client(t)
	ctx := t.Context()

	a, err := cs[0].Lock(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs[0].Lock(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	waiterErr := make(chan error, 1)
	go func() { _, err := cs[0].Lock(ctx, "x"); waiterErr <- err }()
	etcdtest.WaitFor(t, "waiter", 20*time.Second, func() bool { return cs[0].LocalWaiters("x") == 1 })

	if err := cs[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-waiterErr; !errors.Is(err, coordinator.ErrClosed) {
		t.Fatalf("waiter got %v, want ErrClosed", err)
	}
	if !errors.Is(a.Err(), coordinator.ErrClosed) {
		t.Fatalf("held lock Err = %v, want ErrClosed", a.Err())
	}
	if n := countKeys(t, raw, engines.Of(cs[0]).Keys.Prefix()+"locks/"); n != 0 {
		t.Fatalf("%d lock keys left after Close", n)
	}
	leases, err := raw.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Leases {
		if l.ID == a.Lease() {
			t.Fatal("the closed coordinator's lease still exists")
		}
	}
	if _, err := cs[0].Lock(ctx, "x"); !errors.Is(err, coordinator.ErrClosed) {
		t.Fatalf("Lock after Close: %v, want ErrClosed", err)
	}
	// The other process gets both locks at once.
	for _, name := range []string{"x", "y"} {
		l, err := cs[1].Lock(ctx, name, coordinator.TryFor(0))
		if err != nil {
			t.Fatalf("TryLock %s after the holder closed: %v", name, err)
		}
		_ = l.Unlock(ctx)
	}
}

func TestBadLockNames(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	c := newCoordinators(t, etcd, 1)[0]
	for _, name := range []string{"", "a/b", "with space", "tab\there", "nul\x00", string(make([]byte, 257)), "é"} {
		if _, err := c.Lock(t.Context(), name); !errors.Is(err, coordinator.ErrInvalidArgument) {
			t.Errorf("Lock(%q): %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := c.Lock(t.Context(), "ok", coordinator.TryFor(-time.Second)); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Errorf("TryLock with a negative wait: %v", err)
	}
}

func TestOptionsValidated(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cli := etcd.Client(t)
	for name, opt := range map[string]coordinator.Option{
		"ttl below a second":   coordinator.WithSessionTTL(500 * time.Millisecond),
		"ttl not whole":        coordinator.WithSessionTTL(1500 * time.Millisecond),
		"negative cohort":      coordinator.WithCohort(-1, time.Second),
		"cohort beyond tokens": coordinator.WithCohort(coordinator.MaxCohortHandoffs+1, time.Second),
		"empty prefix":         coordinator.WithPrefix(""),
		"zero release budget":  coordinator.WithReleaseTimeout(0),
		"nil logger":           coordinator.WithLogger(nil),
	} {
		if _, err := coordinator.New(cli, opt); !errors.Is(err, coordinator.ErrInvalidArgument) {
			t.Errorf("%s: New returned %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := coordinator.New(nil); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Errorf("nil client: %v", err)
	}
}

// Invariant: a coordinator's Close warns of nothing lost. Its revoked
// lease deletes its segment locks' keys, and the segment engine's watch of
// those keys saw the deletions before the lock engine had ended its
// holds: each tenure was "lock lost: its etcd key is gone" at Warn (a
// benchmark's serve processes, stopped after a run, flagged it; nothing
// was lost but the process's own keys at its own close).
func TestCloseWarnsOfNoLostLock(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	ctx := t.Context()
	const skus = 64
	setup := newCoordinator(t, etcd)
	raw := etcd.Client(t)
	for i := range skus {
		if _, err := setup.CreateSKU(ctx, fmt.Sprintf("w%d", i), coordinator.SKUConfig{Total: 1000, Segments: 4, InitialFill: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	// The watch and Close race: each round is one more chance (the old
	// code logged in 9 of 10 runs).
	for round := range 20 {
		var log etcdtest.WarnLog
		c, err := coordinator.New(etcd.Client(t), coordinator.WithLogger(slog.New(&log)), coordinator.WithTenure(time.Minute, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		// A step makes an order hold its segment's lock, kept after it as
		// the process's tenure: one per SKU.
		for i := range skus {
			order := fmt.Sprintf("r%d", round)
			if _, err := c.AllocateFunc(ctx, fmt.Sprintf("w%d", i), order, 1, "", func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
		if held := countKeys(t, raw, engines.Of(c).Keys.StockLocksPrefix()); held != skus {
			t.Fatalf("round %d: %d segment lock keys before Close, want the process's %d tenures", round, held, skus)
		}
		// And a hold of every kind of named lock (the lock engine's own
		// watch of their keys).
		var holds []*coordinator.Lock
		for i := range 8 {
			for _, acquire := range []func() (*coordinator.Lock, error){
				func() (*coordinator.Lock, error) { return c.Lock(ctx, fmt.Sprintf("x%d", i)) },
				func() (*coordinator.Lock, error) { return c.RLock(ctx, fmt.Sprintf("r%d", i)) },
				func() (*coordinator.Lock, error) { return c.AcquirePermit(ctx, fmt.Sprintf("s%d", i), 2) },
			} {
				l, err := acquire()
				if err != nil {
					t.Fatal(err)
				}
				holds = append(holds, l)
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if msgs := log.Messages(); len(msgs) > 0 {
			t.Fatalf("round %d: Close logged %q", round, msgs)
		}
		for _, l := range holds {
			if !errors.Is(l.Err(), coordinator.ErrClosed) {
				t.Fatalf("round %d: a hold of %s ended with %v, want ErrClosed", round, l.Name(), l.Err())
			}
		}
	}
}
