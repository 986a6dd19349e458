package coordinator_test

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Invariant: at most limit holders at once, across processes and
// goroutines; each permit's fenced writes commit while it is held.
func TestSemaphoreLimit(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 4)
	ctx := t.Context()
	const limit, perProcess, rounds = 3, 4, 5

	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for _, c := range cs {
		for range perProcess {
			wg.Go(func() {
				for range rounds {
					l, err := c.AcquirePermit(ctx, "sem", limit)
					if err != nil {
						t.Error(err)
						return
					}
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					tr, err := l.Txn(ctx).Commit()
					if err != nil || !tr.Succeeded {
						t.Errorf("fenced txn of a held permit: %v", err)
					}
					inside.Add(-1)
					if err := l.Unlock(ctx); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	if m := most.Load(); m > limit {
		t.Fatalf("%d holders at once, limit %d", m, limit)
	}
	if n := countKeys(t, etcd.Client(t), engines.Of(cs[0]).Keys.Semaphore("sem")); n != 0 {
		t.Fatalf("%d keys left", n)
	}
}

// Invariant: the limit-th + 1 acquirer waits; permits are served in the
// order processes queued in etcd.
func TestSemaphoreFIFO(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 6)
	raw := etcd.Client(t)
	ctx := t.Context()
	pfx := engines.Of(cs[0]).Keys.Semaphore("fifo-sem")

	var holders []*coordinator.Lock
	for _, c := range cs[:2] {
		l, err := c.AcquirePermit(ctx, "fifo-sem", 2, coordinator.TryFor(0))
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, l)
	}
	if _, err := cs[2].AcquirePermit(ctx, "fifo-sem", 2, coordinator.TryFor(0)); !errors.Is(err, coordinator.ErrLocked) {
		t.Fatalf("a third permit of 2: %v, want ErrLocked", err)
	}
	var got order
	var wg sync.WaitGroup
	release := make(chan struct{})
	for i, c := range cs[2:] {
		who := fmt.Sprint("P", i+2)
		wg.Go(func() {
			l, err := c.AcquirePermit(ctx, "fifo-sem", 2)
			if err != nil {
				t.Error(who, err)
				return
			}
			got.add(who)
			<-release
			_ = l.Unlock(ctx)
		})
		etcdtest.WaitFor(t, who+" to queue", 20*time.Second, func() bool { return countKeys(t, raw, pfx) == int64(i+3) })
	}
	for i, l := range holders {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, "the next waiter", 20*time.Second, func() bool { return len(got.list()) == i+1 })
	}
	close(release) // P2 and P3 release: P4 and P5 get theirs
	wg.Wait()
	if g := strings.Join(got.list(), " "); g != "P2 P3 P4 P5" {
		t.Fatalf("served in order %s, want P2 P3 P4 P5", g)
	}
}

// Invariant: a bad limit, a limit other than the semaphore's, a bad name,
// each get a clear error and change nothing in etcd.
func TestSemaphoreBadInput(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 2)
	raw := etcd.Client(t)
	ctx := t.Context()
	prefix := engines.Of(cs[0]).Keys.Prefix()

	held, err := cs[0].AcquirePermit(ctx, "db", 2)
	if err != nil {
		t.Fatal(err)
	}
	before := keyRevisions(t, raw, prefix)
	for _, tc := range []struct {
		name  string
		c     *coordinator.Coordinator
		sem   string
		limit int
		want  error
	}{
		{"limit 0", cs[1], "db", 0, coordinator.ErrInvalidArgument},
		{"negative limit", cs[1], "db", -1, coordinator.ErrInvalidArgument},
		{"limit too large", cs[1], "db", coordinator.MaxSemaphoreLimit + 1, coordinator.ErrInvalidArgument},
		{"other limit, other process", cs[1], "db", 3, coordinator.ErrLimitMismatch},
		{"other limit, same process", cs[0], "db", 1, coordinator.ErrLimitMismatch},
		{"empty name", cs[1], "", 2, coordinator.ErrInvalidArgument},
		{"oversized name", cs[1], strings.Repeat("n", coordinator.MaxLockNameLen+1), 2, coordinator.ErrInvalidArgument},
		{"slash in name", cs[1], "a/b", 2, coordinator.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.AcquirePermit(ctx, tc.sem, tc.limit, coordinator.TryFor(time.Second))
			if !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			if errors.Is(tc.want, coordinator.ErrLimitMismatch) {
				var le *coordinator.LimitMismatchError
				if !errors.Is(err, coordinator.ErrConflict) || !errors.As(err, &le) || le.Want != tc.limit || le.Have != 2 {
					t.Fatalf("%v: want ErrConflict and a LimitMismatchError{Want %d, Have 2}", err, tc.limit)
				}
			}
			if after := keyRevisions(t, raw, prefix); !maps.Equal(before, after) {
				t.Fatalf("etcd changed: %v -> %v", before, after)
			}
		})
	}
	if _, err := cs[1].AcquirePermit(ctx, "db", 2, coordinator.TryFor(-time.Second)); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Fatalf("negative wait: %v", err)
	}
	// Once nobody holds it, a new limit is fine.
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := cs[1].AcquirePermit(ctx, "db", 5, coordinator.TryFor(0))
	if err != nil || l.Limit() != 5 || l.Kind() != coordinator.KindSemaphore {
		t.Fatalf("new limit after the last holder left: %v", err)
	}
	_ = l.Unlock(ctx)
}

// keyRevisions is every key under prefix with its mod revision.
func keyRevisions(t *testing.T, cli *clientv3.Client, prefix string) map[string]int64 {
	t.Helper()
	resp, err := cli.Get(t.Context(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, kv := range resp.Kvs {
		m[string(kv.Key)] = kv.ModRevision
	}
	return m
}

// Invariant: a permit released while goroutines of the same process wait
// goes to the oldest of them without a round trip (same key), each holder
// with a larger token; a revoked lease gives its permits back and ends
// their holds.
func TestSemaphoreLocalHandoffAndRevoke(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 2, coordinator.WithCohort(32, time.Hour), coordinator.WithSessionTTL(2*time.Second))
	raw := etcd.Client(t)
	ctx := t.Context()

	first, err := cs[0].AcquirePermit(ctx, "one", 1)
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan *coordinator.Lock, 4)
	for i := range 4 {
		go func() {
			l, err := cs[0].AcquirePermit(ctx, "one", 1)
			if err != nil {
				t.Error(err)
			}
			results <- l
		}()
		// The first of them waits in etcd (the process's turn), the others
		// locally.
		etcdtest.WaitFor(t, "the goroutine to queue", 20*time.Second, func() bool {
			if i == 0 {
				return countKeys(t, raw, engines.Of(cs[0]).Keys.Semaphore("one")) == 2
			}
			return cs[0].LocalPermitWaiters("one") == i
		})
	}
	last := first
	_ = first.Unlock(ctx)
	for range 4 {
		l := <-results
		if l == nil {
			t.FailNow()
		}
		if l.Token() <= last.Token() {
			t.Fatalf("token %d after %d", l.Token(), last.Token())
		}
		last = l
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}

	held, err := cs[0].AcquirePermit(ctx, "one", 1)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *coordinator.Lock, 1)
	go func() { l, _ := cs[1].AcquirePermit(ctx, "one", 1); got <- l }()
	if _, err := raw.Revoke(ctx, held.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Done():
	case <-time.After(hangBound):
		t.Fatal("Done did not fire after the lease was revoked")
	}
	l := <-got
	if l == nil || l.Token() <= held.Token() {
		t.Fatalf("the other process's permit after the revoke: %v", l)
	}
	_ = l.Unlock(ctx)
}

// Invariant (lock-delay): when a holder acquired under a lock-delay is lost
// without releasing, the next holder waits the delay (counted in
// stockctl_lock_delays_total) and removes the record; after a clean release
// nobody waits and no record is left.
func TestLockDelay(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	const delay = 1500 * time.Millisecond
	reg := prometheus.NewRegistry()
	holder := newCoordinators(t, etcd, 1, coordinator.WithLockDelay(delay))[0]
	next := newCoordinators(t, etcd, 1, coordinator.WithMetrics(reg))[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	records := engines.Of(holder).Keys.Prefix() + "delays/"

	for _, kind := range []coordinator.LockKind{coordinator.KindExclusive, coordinator.KindSemaphore} {
		name := "delayed-" + kind.String()
		// A clean release: no delay, no record left.
		ls, err := lockAll(ctx, []*coordinator.Coordinator{holder}, kind, name, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n := countKeys(t, raw, records); n != 1 {
			t.Fatalf("%v: %d lock-delay records while held, want 1", kind, n)
		}
		_ = ls[0].Unlock(ctx)
		if n := countKeys(t, raw, records); n != 0 {
			t.Fatalf("%v: %d records after a clean release", kind, n)
		}
		ln, err := lockAll(ctx, []*coordinator.Coordinator{next}, kind, name, 1)
		if err != nil {
			t.Fatal(err)
		}
		_ = ln[0].Unlock(ctx)
		if d := counterValue(t, reg, "stockctl_lock_delays_total"); d != 0 {
			t.Fatalf("%v: %v delays after a clean release", kind, d)
		}
	}
	// A holder lost without releasing (its lease revoked, as if it had
	// expired).
	ls, err := lockAll(ctx, []*coordinator.Coordinator{holder}, coordinator.KindExclusive, "lost", 0)
	if err != nil {
		t.Fatal(err)
	}
	lostAt := time.Now()
	if _, err := raw.Revoke(ctx, ls[0].Lease()); err != nil {
		t.Fatal(err)
	}
	l, err := next.Lock(ctx, "lost")
	if err != nil {
		t.Fatal(err)
	}
	// A lower bound: the delay is a wait of at least delay after the loss
	// was found, which came after lostAt.
	if waited := time.Since(lostAt); waited < delay {
		t.Fatalf("the next holder got the lock %v after the loss, before the lock-delay of %v", waited, delay)
	}
	if d := counterValue(t, reg, "stockctl_lock_delays_total"); d != 1 {
		t.Fatalf("%v delays counted, want 1", d)
	}
	if n := countKeys(t, raw, records); n != 0 {
		t.Fatalf("%d records left after the next holder took the lock", n)
	}
	_ = l.Unlock(ctx)
	for _, bad := range []time.Duration{-time.Second, coordinator.MaxLockDelay + time.Second} {
		if _, err := coordinator.New(raw, coordinator.WithLockDelay(bad)); !errors.Is(err, coordinator.ErrInvalidArgument) {
			t.Errorf("WithLockDelay(%v): %v", bad, err)
		}
	}
}

// counterValue sums a counter's series in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
