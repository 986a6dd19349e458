package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/keys"
)

// order records the order in which goroutines got a lock.
type order struct {
	mu  sync.Mutex
	got []string
}

func (o *order) add(who string) {
	o.mu.Lock()
	o.got = append(o.got, who)
	o.mu.Unlock()
}

func (o *order) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}

// exclusiveKeys counts the exclusive keys of a lock in etcd.
func exclusiveKeys(t *testing.T, cli *clientv3.Client, c *coordinator.Coordinator, name string) int {
	t.Helper()
	pfx := engines.Of(c).Keys.Lock(name)
	resp, err := cli.Get(t.Context(), pfx, clientv3.WithRange(keys.ExclusiveEnd(pfx)), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.Count)
}

// Invariant: shared holders of one lock, in several processes, hold it
// together; an exclusive holder waits until all of them are gone, and a
// shared holder waits while an exclusive one holds.
func TestRWSharedTogetherExclusiveAlone(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 3)
	ctx := t.Context()

	var readers []*coordinator.Lock
	for _, c := range cs {
		l, err := c.RLock(ctx, "rw", coordinator.TryFor(0))
		if err != nil {
			t.Fatalf("shared hold while others hold shared: %v", err)
		}
		if l.Kind() != coordinator.KindShared {
			t.Fatalf("Kind = %v", l.Kind())
		}
		readers = append(readers, l)
	}
	if _, err := cs[0].Lock(ctx, "rw", coordinator.TryFor(0)); !errors.Is(err, coordinator.ErrLocked) {
		t.Fatalf("exclusive TryLock while shared holders hold: %v, want ErrLocked", err)
	}
	for _, l := range readers {
		if tr, err := l.Txn(ctx).Commit(); err != nil || !tr.Succeeded {
			t.Fatalf("a shared holder's fenced txn: %v", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := cs[1].Lock(ctx, "rw", coordinator.TryFor(0))
	if err != nil {
		t.Fatalf("exclusive after the readers left: %v", err)
	}
	if _, err := cs[2].RLock(ctx, "rw", coordinator.TryFor(0)); !errors.Is(err, coordinator.ErrLocked) {
		t.Fatalf("shared TryRLock while a writer holds: %v, want ErrLocked", err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, etcd.Client(t), engines.Of(cs[0]).Keys.Lock("rw")); n != 0 {
		t.Fatalf("%d keys left", n)
	}
}

// Invariant (no writer starvation): a shared request that arrives after an
// exclusive one is queued waits for it, whether it comes from another
// process or from a process that holds the lock shared right now.
func TestRWNoWriterStarvation(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 3)
	a, b, c := cs[0], cs[1], cs[2]
	raw := etcd.Client(t)
	ctx := t.Context()

	held, err := a.RLock(ctx, "starve")
	if err != nil {
		t.Fatal(err)
	}
	if !a.SharedJoinable("starve") {
		t.Fatal("A's shared key is not open to A's readers with no writer queued")
	}
	var got order
	var wg sync.WaitGroup
	run := func(who string, lock func() (*coordinator.Lock, error)) {
		wg.Go(func() {
			l, err := lock()
			if err != nil {
				t.Error(who, err)
				return
			}
			got.add(who)
			if err := l.Unlock(ctx); err != nil {
				t.Error(who, err)
			}
		})
	}
	run("writer B", func() (*coordinator.Lock, error) { return b.Lock(ctx, "starve") })
	etcdtest.WaitFor(t, "B's exclusive key", 20*time.Second, func() bool { return exclusiveKeys(t, raw, a, "starve") == 1 })
	// A learns of the writer through its key watch and stops admitting
	// its own readers to its key.
	etcdtest.WaitFor(t, "A to close its shared key", 20*time.Second, func() bool { return !a.SharedJoinable("starve") })
	run("reader C", func() (*coordinator.Lock, error) { return c.RLock(ctx, "starve") })
	run("reader A2", func() (*coordinator.Lock, error) { return a.RLock(ctx, "starve") })
	etcdtest.WaitFor(t, "the late readers to queue in etcd", 20*time.Second, func() bool {
		return countKeys(t, raw, engines.Of(a).Keys.SharedLock("starve")) == 3
	})
	if g := got.list(); len(g) != 0 {
		t.Fatalf("%v got the lock while A held it shared and B waited", g)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if g := got.list(); len(g) != 3 || g[0] != "writer B" {
		t.Fatalf("served in order %v, want writer B first", g)
	}
}

// Invariant: holders are served in the order they queued in etcd, shared
// holders queued together holding together.
func TestRWFIFOAcrossProcesses(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 5)
	raw := etcd.Client(t)
	ctx := t.Context()
	pfx := engines.Of(cs[0]).Keys.Lock("fifo-rw")

	first, err := cs[0].Lock(ctx, "fifo-rw")
	if err != nil {
		t.Fatal(err)
	}
	type req struct {
		who    string
		shared bool
	}
	queue := []req{{"R1", true}, {"W2", false}, {"R3", true}, {"R4", true}}
	var got order
	release := make([]chan struct{}, len(queue))
	var wg sync.WaitGroup
	for i, r := range queue {
		release[i] = make(chan struct{})
		c := cs[i+1]
		wg.Go(func() {
			lock := c.Lock
			if r.shared {
				lock = c.RLock
			}
			l, err := lock(ctx, "fifo-rw")
			if err != nil {
				t.Error(r.who, err)
				return
			}
			got.add(r.who)
			<-release[i]
			if err := l.Unlock(ctx); err != nil {
				t.Error(r.who, err)
			}
		})
		etcdtest.WaitFor(t, r.who+" to queue", 20*time.Second, func() bool { return countKeys(t, raw, pfx) == int64(i+2) })
	}
	held := func(n int) func() bool { return func() bool { return len(got.list()) == n } }
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "R1", 20*time.Second, held(1))
	close(release[0])
	etcdtest.WaitFor(t, "W2", 20*time.Second, held(2))
	close(release[1])
	etcdtest.WaitFor(t, "R3 and R4 together", 20*time.Second, held(4))
	close(release[2])
	close(release[3])
	wg.Wait()
	g := got.list()
	if g[0] != "R1" || g[1] != "W2" || !slices.Contains(g[2:], "R3") || !slices.Contains(g[2:], "R4") {
		t.Fatalf("served in order %v, want R1, W2, then R3 and R4", g)
	}
}

// Invariant: readers of one process share one key while it is open, each
// with a token of its own, larger than any before; reentrant RLock shares
// its hold's token; asking for the other mode with a holder's ctx fails at
// once.
func TestRWLocalJoinsAndModes(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	c := newCoordinators(t, etcd, 1, coordinator.WithCohort(32, time.Hour))[0]
	raw := etcd.Client(t)
	ctx := t.Context()

	first, err := c.RLock(ctx, "join")
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[int64]bool{first.Token(): true}
	var holds []*coordinator.Lock
	for range 8 {
		l, err := c.RLock(ctx, "join")
		if err != nil {
			t.Fatal(err)
		}
		if l.Revision() != first.Revision() {
			t.Fatalf("a joining reader got key revision %d, want the process's %d", l.Revision(), first.Revision())
		}
		if tokens[l.Token()] || l.Token() <= first.Token() {
			t.Fatalf("token %d repeats or is not above the first %d", l.Token(), first.Token())
		}
		tokens[l.Token()] = true
		holds = append(holds, l)
	}
	if n := countKeys(t, raw, engines.Of(c).Keys.SharedLock("join")); n != 1 {
		t.Fatalf("%d shared keys for 9 readers of one process, want 1", n)
	}
	again, err := c.RLock(first.Context(), "join")
	if err != nil || again.Token() != first.Token() {
		t.Fatalf("reentrant RLock: %v, token %d want %d", err, again.Token(), first.Token())
	}
	for _, tc := range []struct {
		name string
		try  func() error
	}{
		{"Lock with a shared hold's ctx", func() error { _, err := c.Lock(first.Context(), "join"); return err }},
		{"TryLock with a shared hold's ctx", func() error { _, err := c.Lock(first.Context(), "join", coordinator.TryFor(time.Second)); return err }},
	} {
		if err := tc.try(); !errors.Is(err, coordinator.ErrModeHeld) || !errors.Is(err, coordinator.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrModeHeld", tc.name, err)
		}
	}
	for _, l := range append(holds, again, first) {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := c.Lock(ctx, "join")
	if err != nil {
		t.Fatal(err)
	}
	if w.Token() <= first.Token()+8 {
		t.Fatalf("the writer's token %d is not above the readers' (first %d)", w.Token(), first.Token())
	}
	if _, err := c.RLock(w.Context(), "join"); !errors.Is(err, coordinator.ErrModeHeld) {
		t.Fatalf("RLock with an exclusive hold's ctx: %v, want ErrModeHeld", err)
	}
	_ = w.Unlock(ctx)
	for _, name := range []string{"", "a/b", string(make([]byte, coordinator.MaxLockNameLen+1))} {
		if _, err := c.RLock(ctx, name); !errors.Is(err, coordinator.ErrInvalidArgument) {
			t.Errorf("RLock(%q): %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := c.RLock(ctx, "x", coordinator.TryFor(-time.Second)); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Errorf("TryRLock with a negative wait: %v", err)
	}
}

// Invariant (issue 19.7): a held lock whose etcd key is deleted from
// outside (etcdctl del) while another process takes it ends at once: Done
// fires, Err is ErrLockLost, and its fenced writes fail. For every kind.
func TestKeyDeletedEndsHold(t *testing.T) {
	for _, kind := range []coordinator.LockKind{coordinator.KindExclusive, coordinator.KindShared, coordinator.KindSemaphore} {
		t.Run(kind.String(), func(t *testing.T) {
			etcd := etcdtest.NewSingle(t)
			cs := newCoordinators(t, etcd, 2)
			raw := etcd.Client(t)
			ctx := t.Context()
			acquire := func(c *coordinator.Coordinator) (*coordinator.Lock, error) {
				switch kind {
				case coordinator.KindShared:
					return c.RLock(ctx, "deleted")
				case coordinator.KindSemaphore:
					return c.AcquirePermit(ctx, "deleted", 1)
				}
				return c.Lock(ctx, "deleted")
			}
			held, err := acquire(cs[0])
			if err != nil {
				t.Fatal(err)
			}
			other := make(chan *coordinator.Lock, 1)
			if kind == coordinator.KindShared {
				// Readers do not exclude each other: the other process
				// takes it exclusively.
				go func() { l, _ := cs[1].Lock(ctx, "deleted"); other <- l }()
			} else {
				go func() { l, _ := acquire(cs[1]); other <- l }()
			}
			if _, err := raw.Delete(ctx, held.Key()); err != nil {
				t.Fatal(err)
			}
			select {
			case <-held.Done():
			case <-time.After(hangBound):
				t.Fatal("Done did not fire after the key was deleted")
			}
			if !errors.Is(held.Err(), coordinator.ErrLockLost) {
				t.Fatalf("Err = %v, want ErrLockLost", held.Err())
			}
			if tr, err := held.Txn(ctx).Commit(); err != nil || tr.Succeeded {
				t.Fatalf("fenced txn after the deletion: %v", err)
			}
			l := <-other
			if l == nil {
				t.Fatal("the other process did not get the lock")
			}
			if err := held.Unlock(ctx); !errors.Is(err, coordinator.ErrLockLost) {
				t.Fatalf("Unlock of the lost hold: %v, want ErrLockLost", err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// The process whose key was deleted works again.
			again, err := acquire(cs[0])
			if err != nil {
				t.Fatal(err)
			}
			_ = again.Unlock(ctx)
		})
	}
}

// hangBound bounds waits that only a hang would exceed.
const hangBound = 60 * time.Second

// lockAll acquires name of kind in each coordinator, in order, and returns
// the holds (helper of tests that need holders of every kind).
func lockAll(ctx context.Context, cs []*coordinator.Coordinator, kind coordinator.LockKind, name string, limit int) ([]*coordinator.Lock, error) {
	var out []*coordinator.Lock
	for _, c := range cs {
		var l *coordinator.Lock
		var err error
		switch kind {
		case coordinator.KindShared:
			l, err = c.RLock(ctx, name)
		case coordinator.KindSemaphore:
			l, err = c.AcquirePermit(ctx, name, limit)
		default:
			l, err = c.Lock(ctx, name)
		}
		if err != nil {
			return out, fmt.Errorf("%v %s: %w", kind, name, err)
		}
		out = append(out, l)
	}
	return out, nil
}

// Invariant: Locks lists holders and waiters by the protocol's rules, at
// one revision.
func TestLocksListing(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	cs := newCoordinators(t, etcd, 3)
	raw := etcd.Client(t)
	ctx := t.Context()

	r, err := cs[0].RLock(ctx, "listed")
	if err != nil {
		t.Fatal(err)
	}
	go func() { // an exclusive waiter behind the reader
		if l, err := cs[1].Lock(ctx, "listed"); err == nil {
			_ = l.Unlock(ctx)
		}
	}()
	p, err := cs[2].AcquirePermit(ctx, "pool", 1)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if l, err := cs[0].AcquirePermit(ctx, "pool", 1); err == nil {
			_ = l.Unlock(ctx)
		}
	}()
	etcdtest.WaitFor(t, "both waiters", 20*time.Second, func() bool {
		return countKeys(t, raw, engines.Of(cs[0]).Keys.Lock("listed")) == 2 &&
			countKeys(t, raw, engines.Of(cs[0]).Keys.Semaphore("pool")) == 2
	})
	ls, rev, err := cs[0].Locks(ctx)
	if err != nil || rev == 0 || len(ls) != 2 {
		t.Fatalf("Locks = %+v, %d, %v", ls, rev, err)
	}
	lk, sem := ls[0], ls[1]
	if lk.Name != "listed" || lk.Semaphore || len(lk.Holders) != 1 || lk.Holders[0].Kind != coordinator.KindShared ||
		lk.Holders[0].Key != r.Key() || len(lk.Waiters) != 1 || lk.Waiters[0].Kind != coordinator.KindExclusive {
		t.Fatalf("lock listed as %+v", lk)
	}
	if sem.Name != "pool" || !sem.Semaphore || sem.Limit != 1 || len(sem.Holders) != 1 || sem.Holders[0].Key != p.Key() ||
		len(sem.Waiters) != 1 || sem.Holders[0].Revision >= sem.Waiters[0].Revision {
		t.Fatalf("semaphore listed as %+v", sem)
	}
	_ = r.Unlock(ctx)
	_ = p.Unlock(ctx)
}
