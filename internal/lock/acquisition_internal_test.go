package lock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// acquireAsync starts an acquisition of pfx by e under ctx, waiting as long
// as ctx allows; the channel receives its outcome.
func acquireAsync(ctx context.Context, e *Engine, pfx string) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		h, err := e.Acquire(ctx, pfx, KindNamed, -1)
		ch <- acquired{h, err}
	}()
	return ch
}

type acquired struct {
	h   *Hold
	err error
}

// waitKeys waits until the lock keys under pfx are exactly n (bounded by
// etcdtest.MinWait) and returns them, oldest first.
func waitKeys(t *testing.T, raw *clientv3.Client, pfx string, n int) []keyRev {
	t.Helper()
	deadline := time.Now().Add(etcdtest.MinWait)
	for {
		resp, err := raw.Get(t.Context(), pfx, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == n {
			out := make([]keyRev, n)
			for i, kv := range resp.Kvs {
				out[i] = keyRev{string(kv.Key), kv.CreateRevision}
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lock keys under %s after %v, want %d", len(resp.Kvs), pfx, etcdtest.MinWait, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type keyRev struct {
	key string
	rev int64
}

// waitLocalWaiters waits until e's queue for pfx has n goroutines queued
// behind the one whose turn it is.
func waitLocalWaiters(t *testing.T, e *Engine, pfx string, n int) {
	t.Helper()
	deadline := time.Now().Add(etcdtest.MinWait)
	for {
		q, _ := e.lookup(pfx).(*Queue)
		if q != nil {
			q.mu.Lock()
			got := q.waiters.Len()
			q.mu.Unlock()
			if got == n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d local waiters did not queue within %v", pfx, n, etcdtest.MinWait)
		}
		time.Sleep(time.Millisecond)
	}
}

// Invariant: a process keeps its place in etcd's queue for a lock while any
// of its goroutines waits for it. When the goroutine whose turn it was gives
// up (its budget ends), the key it put stays, at the same revision, and the
// next goroutine gets the lock in that place, before a process that queued
// later. Before, the key was deleted and put again at the back of the queue,
// behind every process that queued meanwhile: at the end of a fragmented
// sale, where holders keep a contended segment longer than an order waits,
// a process could wait through holder after holder and never reach the
// front (TestSaleSellsExactlyTheTotal past its hang guard on a busy machine).
func TestGivingUpKeepsTheProcessPlace(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	raw := etcd.Client(t)
	holder, waiting, later := newEngine(t, etcd.Client(t)), newEngine(t, etcd.Client(t)), newEngine(t, etcd.Client(t))
	const pfx = "/t/locks/place/"
	ctx := t.Context()

	hold, err := holder.Acquire(ctx, pfx, KindNamed, -1)
	if err != nil {
		t.Fatal(err)
	}
	firstCtx, giveUp := context.WithCancelCause(ctx)
	first := acquireAsync(firstCtx, waiting, pfx)
	place := waitKeys(t, raw, pfx, 2)[1] // the waiting process's key
	second := acquireAsync(ctx, waiting, pfx)
	waitLocalWaiters(t, waiting, pfx, 1)
	third := acquireAsync(ctx, later, pfx)
	waitKeys(t, raw, pfx, 3)

	budgetEnded := errors.New("the first goroutine's budget ended")
	giveUp(budgetEnded)
	if r := <-first; !errors.Is(r.err, budgetEnded) {
		t.Fatalf("the goroutine that gave up: hold %v, error %v; want %v", r.h, r.err, budgetEnded)
	}
	if now := waitKeys(t, raw, pfx, 3); now[1] != place {
		t.Fatalf("after one goroutine gave up, the keys are %v: the waiting process's key %v lost its place", now, place)
	}

	if err := hold.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-second
	if r.err != nil {
		t.Fatalf("the goroutine still waiting: %v", r.err)
	}
	if got := r.h.Own().Rev(); got != place.rev {
		t.Errorf("the lock came under a key put at revision %d, want the kept key's %d", got, place.rev)
	}
	select {
	case r3 := <-third:
		t.Fatalf("the process that queued later got the lock first (%v, %v)", r3.h, r3.err)
	default:
	}
	if err := r.h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r3 := <-third
	if r3.err != nil {
		t.Fatalf("the later process: %v", r3.err)
	}
	if err := r3.h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Invariant: a key kept for waiting goroutines goes once none is left: when
// the last of them gives up, the process's key is removed from etcd and its
// queue is idle, so that no process waits behind a place nobody wants.
func TestLastWaiterGivingUpRemovesTheKey(t *testing.T) {
	for _, waiters := range []int{1, 2, 5} {
		t.Run(fmt.Sprintf("%d waiters", waiters), func(t *testing.T) {
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
			raw := etcd.Client(t)
			holder, waiting := newEngine(t, etcd.Client(t)), newEngine(t, etcd.Client(t))
			const pfx = "/t/locks/gone/"
			ctx := t.Context()
			hold, err := holder.Acquire(ctx, pfx, KindNamed, -1)
			if err != nil {
				t.Fatal(err)
			}
			var gaveUp []context.CancelCauseFunc
			var outcomes []<-chan acquired
			for i := range waiters {
				wctx, cancel := context.WithCancelCause(ctx)
				gaveUp = append(gaveUp, cancel)
				outcomes = append(outcomes, acquireAsync(wctx, waiting, pfx))
				if i == 0 {
					waitKeys(t, raw, pfx, 2)
				} else {
					waitLocalWaiters(t, waiting, pfx, i)
				}
			}
			for i := range waiters {
				cause := fmt.Errorf("waiter %d gives up", i)
				gaveUp[i](cause)
				if r := <-outcomes[i]; !errors.Is(r.err, cause) {
					t.Fatalf("waiter %d: hold %v, error %v; want %v", i, r.h, r.err, cause)
				}
				if i < waiters-1 {
					waitKeys(t, raw, pfx, 2) // kept for the others
				}
			}
			if keys := waitKeys(t, raw, pfx, 1); keys[0].key != hold.Own().Key() {
				t.Fatalf("left in etcd: %v, want only the holder's key", keys)
			}
			deadline := time.Now().Add(etcdtest.MinWait)
			for q := waiting.lookup(pfx); q != nil; q = waiting.lookup(pfx) {
				if time.Now().After(deadline) {
					t.Fatalf("the waiting process still has a queue for %s after its waiters gave up", pfx)
				}
				time.Sleep(time.Millisecond)
			}
			if err := hold.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
