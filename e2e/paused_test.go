package e2e

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// pausedRun is what one run of the paused-holder scenario counted.
type pausedRun struct {
	acked       int64 // increments acknowledged to their writer
	final       int64 // the counter at the end
	lost        int64 // acked − final
	doubles     int64 // acknowledged writes of a value another acknowledged write had written
	staleAcked  int   // the paused holders' late writes that were acknowledged
	staleDenied int   // ... that etcd rejected
}

// Jepsen's scenario. A holder takes the lock, reads a counter, checks that
// it still holds the lock, and is then frozen (its traffic blackholed, so it
// can neither renew its 2 s lease nor write) until its lease has expired
// and other holders have taken the lock and incremented the counter. Then
// it wakes and writes what it computed before the pause.
//
// Invariant (fenced: every write is a Txn whose If is the lock's IsOwner):
// 0 lost updates (the counter equals the acknowledged increments), 0 double
// writes (no value written by two acknowledged writes), and every late write
// of a woken holder is rejected.
//
// Control (the same writes guarded by the same lock, without the fence):
// every late write is acknowledged, and each costs at least one
// acknowledged update: it erases the increments made during the pause, or
// a worker's write racing it erases the late write itself. Its value was
// written before, so it is also a double write. The control must show at
// least one lost update and one double write per pause, or the pause was
// not injected.
func TestPausedHolder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fenced bool
	}{
		{"fenced", true},
		{"unfenced control", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runPausedHolder(t, tc.fenced, false)
			t.Logf("%s: %d acknowledged increments, counter %d: %d lost (%.1f%%), %d double writes; late writes of paused holders: %d acknowledged, %d rejected",
				tc.name, r.acked, r.final, r.lost, 100*float64(r.lost)/float64(max(r.acked, 1)), r.doubles, r.staleAcked, r.staleDenied)
			if tc.fenced {
				if r.lost != 0 || r.doubles != 0 || r.staleAcked != 0 || r.staleDenied != pausedRounds {
					t.Fatalf("fenced writes: %d lost updates, %d double writes, %d late writes acknowledged, %d rejected; want 0, 0, 0, %d",
						r.lost, r.doubles, r.staleAcked, r.staleDenied, pausedRounds)
				}
				return
			}
			// The control must show the failure the fence prevents: if it
			// does not, the pause was not injected.
			if r.staleAcked != pausedRounds || r.lost < pausedRounds || r.doubles < pausedRounds {
				t.Fatalf("unfenced control: %d late writes acknowledged, %d lost updates, %d double writes; want %d, ≥ %d, ≥ %d",
					r.staleAcked, r.lost, r.doubles, pausedRounds, pausedRounds, pausedRounds)
			}
		})
	}
}

const (
	pausedRounds          = 3  // holders frozen per run
	incrementsDuringPause = 5  // increments the others make before a frozen holder wakes
	pausedWorkers         = 2  // other holders, each a coordinator of its own
	maxWorkerIncrements   = 50 // per worker per round: bounds the load loop
)

// The same scenario on a lock placed in the second cluster of a
// coordinator over two (coordinator.NewClusters): the frozen holder is cut
// off from that cluster only, its lease there expires, and its fence is
// that cluster's; the counter lives in that cluster too.
func TestPausedHolderOnSecondCluster(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fenced bool
	}{
		{"fenced", true},
		{"unfenced control", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runPausedHolder(t, tc.fenced, true)
			t.Logf("%s: %d acknowledged increments, counter %d: %d lost, %d double writes; late writes: %d acknowledged, %d rejected",
				tc.name, r.acked, r.final, r.lost, r.doubles, r.staleAcked, r.staleDenied)
			if tc.fenced {
				if r.lost != 0 || r.doubles != 0 || r.staleAcked != 0 || r.staleDenied != pausedRounds {
					t.Fatalf("fenced writes: %d lost updates, %d double writes, %d late writes acknowledged, %d rejected; want 0, 0, 0, %d",
						r.lost, r.doubles, r.staleAcked, r.staleDenied, pausedRounds)
				}
				return
			}
			if r.staleAcked != pausedRounds || r.lost < pausedRounds || r.doubles < pausedRounds {
				t.Fatalf("unfenced control: %d late writes acknowledged, %d lost updates, %d double writes; want %d, ≥ %d, ≥ %d",
					r.staleAcked, r.lost, r.doubles, pausedRounds, pausedRounds, pausedRounds)
			}
		})
	}
}

// runPausedHolder runs the scenario on one etcd, or (second) on the
// second of two clusters, the holder's lock and the counter both there.
func runPausedHolder(t *testing.T, fenced, second bool) pausedRun {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync()) // the cluster the lock lives in
	raw := etcd.Client(t)
	proxy := etcdtest.NewProxy(t, etcd.Endpoints()[0])
	opts := []coordinator.Option{coordinator.WithSessionTTL(ttl), coordinator.WithReleaseTimeout(200 * time.Millisecond)}
	var victim *coordinator.Coordinator
	workers := make([]*coordinator.Coordinator, pausedWorkers)
	// clientOf is the client of the cluster the lock and the counter live in.
	clientOf := func(c *coordinator.Coordinator) *clientv3.Client { return c.Client() }
	lockName := "paused"
	if second {
		first := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
		fleet := func(lockEndpoint string) *coordinator.Coordinator {
			c, err := coordinator.NewClusters(t.Context(), []coordinator.Cluster{
				{Name: "first", Client: etcdtest.NewClient(t, first.Endpoints()...)},
				{Name: "second", Client: etcdtest.NewClient(t, lockEndpoint)}}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		victim = fleet(proxy.Endpoint())
		for i := range workers {
			workers[i] = fleet(etcd.Endpoints()[0])
		}
		clientOf = func(c *coordinator.Coordinator) *clientv3.Client { return c.Cluster("second").Client() }
		lockName = pausedLockIn(t, workers[0], "second")
	} else {
		victim = newCoord(t, []string{proxy.Endpoint()}, opts...)
		for i := range workers {
			workers[i] = newCoord(t, etcd.Endpoints(), opts...)
		}
	}
	// A hang guard only: when it runs out, the workers' calls fail with
	// its deadline (issue 28: "put lock key … context deadline exceeded"
	// after 2 minutes on a busy machine).
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	const counter = "/e2e/paused/counter"

	var mu sync.Mutex
	written := map[int64]int{} // value → acknowledged writes of it
	var acked atomic.Int64
	ack := func(v int64) {
		mu.Lock()
		written[v]++
		mu.Unlock()
		acked.Add(1)
	}
	// write stores v under l: fenced or not. It reports whether the write
	// was acknowledged.
	write := func(ctx context.Context, c *coordinator.Coordinator, l *coordinator.Lock, v int64) (bool, error) {
		cli := clientOf(c)
		if fenced {
			tr, err := l.Txn(ctx).Then(clientv3.OpPut(counter, strconv.FormatInt(v, 10))).Commit()
			return err == nil && tr.Succeeded, err
		}
		_, err := cli.Put(ctx, counter, strconv.FormatInt(v, 10))
		return err == nil, err
	}
	read := func(ctx context.Context, c *coordinator.Coordinator) (int64, error) {
		resp, err := clientOf(c).Get(ctx, counter)
		if err != nil || len(resp.Kvs) == 0 {
			return 0, err
		}
		return strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	}

	// Workers increment at most maxWorkerIncrements times per pause (and as
	// many before the first): the budget is renewed when a pause starts,
	// not when a round is set up, so that fast workers that spent it while
	// the victim queued for the lock still have all of it for the pause.
	var pauses atomic.Int64
	var stop atomic.Bool
	var lockErrs firstErrs
	defer func() {
		if n, first := lockErrs.get(); n > 0 {
			t.Logf("the workers' Lock failed %d times, retried (nothing written); the first: %v", n, first)
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, pausedWorkers)
	for _, w := range workers {
		wg.Go(func() {
			done := int64(-1)
			n := 0
			for !stop.Load() {
				if r := pauses.Load(); r != done {
					done, n = r, 0
				}
				if n >= maxWorkerIncrements {
					time.Sleep(5 * time.Millisecond) // wait for the next pause
					continue
				}
				n++
				if err := increment(ctx, w, lockName, read, write, ack, &lockErrs); err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
			}
		})
	}

	var r pausedRun
	for rd := range pausedRounds {
		// The victim takes the lock (on a new session after the first
		// round), reads, checks the lock, and freezes before writing.
		var l *coordinator.Lock
		retry(t, "victim lock", 30*time.Second, anyErr, func(actx context.Context) (err error) {
			l, err = victim.Lock(actx, lockName)
			return err
		})
		var v int64
		retry(t, "victim read", 30*time.Second, anyErr, func(actx context.Context) (err error) {
			v, err = read(actx, victim)
			return err
		})
		if l.Err() != nil {
			t.Fatalf("round %d: the victim lost the lock before the pause: %v", rd, l.Err())
		}
		before := acked.Load()
		proxy.Blackhole() // the pause: no keepalive, no write
		pauses.Add(1)     // the workers' budget for it
		etcdtest.WaitFor(t, fmt.Sprintf("round %d: %d increments by others while the holder is frozen", rd, incrementsDuringPause),
			30*time.Second, func() bool { return acked.Load()-before >= incrementsDuringPause })
		proxy.Unblackhole() // it wakes and writes what it computed
		var ok bool
		retry(t, "victim late write", 30*time.Second, anyErr, func(actx context.Context) (err error) {
			ok, err = write(actx, victim, l, v+1)
			return err
		})
		if ok {
			ack(v + 1)
			r.staleAcked++
		} else {
			r.staleDenied++
		}
		uctx, ucancel := context.WithTimeout(ctx, 2*time.Second)
		if err := l.Unlock(uctx); err == nil {
			t.Errorf("round %d: unlock after the pause succeeded; the lock cannot have been lost", rd)
		}
		ucancel()
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("worker: %v", err)
	}

	resp, err := raw.Get(ctx, counter)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("read the counter: %v", err)
	}
	final, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	r.acked, r.final = acked.Load(), final
	r.lost = r.acked - r.final
	for _, n := range written {
		r.doubles += int64(n - 1)
	}
	return r
}

// increment is one critical section: lock, read, check, write v+1, unlock.
func increment(ctx context.Context, c *coordinator.Coordinator, name string,
	read func(context.Context, *coordinator.Coordinator) (int64, error),
	write func(context.Context, *coordinator.Coordinator, *coordinator.Lock, int64) (bool, error),
	ack func(int64), lockErrs *firstErrs) error {
	l, err := c.Lock(ctx, name)
	if err != nil {
		// Not taken, so nothing was written: the lost session (the next
		// call starts a new one) or a lock key's put that ran past its
		// bound (ReleaseTimeout, 200 ms here: a loaded machine's etcd
		// takes longer at times, and the key is scrubbed). The scenario
		// is about writes; a worker that cannot take the lock at all
		// fails the round's wait for increments.
		if ctx.Err() == nil {
			lockErrs.add(err)
			return nil
		}
		return err
	}
	defer l.Unlock(context.WithoutCancel(ctx))
	v, err := read(ctx, c)
	if err != nil {
		return err
	}
	if l.Err() != nil {
		return nil
	}
	ok, err := write(ctx, c, l, v+1)
	if err != nil {
		return err
	}
	if ok {
		ack(v + 1)
	}
	return nil
}

// firstErrs counts errors and keeps the first.
type firstErrs struct {
	mu    sync.Mutex
	n     int
	first error
}

func (f *firstErrs) add(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n++; f.first == nil {
		f.first = err
	}
}

func (f *firstErrs) get() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n, f.first
}

// pausedLockIn finds a lock name that c places in the named cluster: it
// takes candidates and reads where the listing shows them.
func pausedLockIn(t *testing.T, c *coordinator.Coordinator, cluster string) string {
	t.Helper()
	for i := range 64 {
		name := fmt.Sprintf("paused-%d", i)
		l, err := c.Lock(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		ls, _, err := c.Locks(t.Context())
		l.Unlock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ls {
			if s.Name == name && s.Cluster == cluster {
				return name
			}
		}
	}
	t.Fatalf("no lock name of 64 placed in cluster %s", cluster)
	return ""
}
