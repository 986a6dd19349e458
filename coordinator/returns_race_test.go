package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// beforeTxn is a gRPC client interceptor that runs a function once, when
// armed, just before the first Txn it was armed for is sent: it puts
// another caller's write between two round trips of the call under test
// (arm: a read-only Txn reading a key under a prefix), or just before its
// commit (armWrite: a write Txn putting a key), deterministically.
type beforeTxn struct {
	mu    sync.Mutex
	match func(*etcdserverpb.TxnRequest) bool
	run   func()
	fired atomic.Int64
}

// arm runs run before the first read-only Txn that reads a key under prefix.
func (b *beforeTxn) arm(prefix string, run func()) {
	b.armIf(func(txn *etcdserverpb.TxnRequest) bool {
		if len(txn.Compare) > 0 {
			return false
		}
		found := false
		for _, op := range txn.Success {
			r := op.GetRequestRange()
			if r == nil {
				return false // a write
			}
			found = found || strings.HasPrefix(string(r.Key), prefix)
		}
		return found
	}, run)
}

// armWrite runs run before the first write Txn that puts key.
func (b *beforeTxn) armWrite(key string, run func()) {
	b.armIf(func(txn *etcdserverpb.TxnRequest) bool {
		for _, op := range txn.Success {
			if put := op.GetRequestPut(); put != nil && string(put.Key) == key {
				return len(txn.Compare) > 0
			}
		}
		return false
	}, run)
}

func (b *beforeTxn) armIf(match func(*etcdserverpb.TxnRequest) bool, run func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.match, b.run = match, run
}

func (b *beforeTxn) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if txn, ok := req.(*etcdserverpb.TxnRequest); ok {
		if run := b.take(txn); run != nil {
			run()
			b.fired.Add(1)
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (b *beforeTxn) take(txn *etcdserverpb.TxnRequest) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.run == nil || !b.match(txn) {
		return nil
	}
	run := b.run
	b.run = nil
	return run
}

// txnCounter is a gRPC client interceptor that counts, once armed, what
// count finds in each Txn the client sends (n, the sum; most, the largest).
type txnCounter struct {
	count   atomic.Pointer[func(*etcdserverpb.TxnRequest) int64]
	n, most atomic.Int64
}

func (c *txnCounter) arm(count func(*etcdserverpb.TxnRequest) int64) { c.count.Store(&count) }
func (c *txnCounter) disarm()                                        { c.count.Store(nil) }

func (c *txnCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if txn, ok := req.(*etcdserverpb.TxnRequest); ok {
		if count := c.count.Load(); count != nil {
			k := (*count)(txn)
			c.n.Add(k)
			for m := c.most.Load(); k > m && !c.most.CompareAndSwap(m, k); m = c.most.Load() {
			}
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// rangesOf counts the reads of a Txn that range key with ok(r) true.
func rangesOf(key string, ok func(*etcdserverpb.RangeRequest) bool) func(*etcdserverpb.TxnRequest) int64 {
	return func(txn *etcdserverpb.TxnRequest) int64 {
		n := int64(0)
		for _, op := range txn.Success {
			if r := op.GetRequestRange(); r != nil && string(r.Key) == key && ok(r) {
				n++
			}
		}
		return n
	}
}

// hookedCoordinator is a coordinator whose client goes through hook.
func hookedCoordinator(t *testing.T, etcd *etcdtest.Single, hook *beforeTxn) *coordinator.Coordinator {
	t.Helper()
	return interceptedCoordinator(t, etcd, hook.intercept)
}

// interceptedCoordinator is a coordinator whose client's unary calls go
// through intercept.
func interceptedCoordinator(t *testing.T, etcd *etcdtest.Single, intercept grpc.UnaryClientInterceptor) *coordinator.Coordinator {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   etcd.Endpoints(),
		DialTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c, err := coordinator.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Invariant (issue 19, item 1): two returns of one order racing (a retried
// webhook's second Release, a redelivered Cancel) answer "already
// released" to the one that loses, never ErrCorrupt. The loser read the
// order before the winner committed and the buyer's counter after: the
// counter then no longer holds the order's units, which is a changed order,
// not a corrupt counter. The winner's return is put between the loser's two
// reads by an interceptor.
func TestReturnRacesReturn(t *testing.T) {
	for _, tc := range []struct {
		name          string
		winner, loser string // "release" or "cancel"
	}{
		{"release after release", "release", "release"},
		{"cancel after cancel", "cancel", "cancel"},
		{"release after cancel", "cancel", "release"},
		{"cancel after release", "release", "cancel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
			var hook beforeTxn
			a := hookedCoordinator(t, etcd, &hook)
			b := newCoordinators(t, etcd, 1)[0]
			ctx := t.Context()
			mustCreate(t, b, "r", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100, PerUserLimit: 4})
			if _, err := b.Reserve(ctx, "r", "o1", 2, "", time.Hour, coordinator.WithBuyer("amy")); err != nil {
				t.Fatal(err)
			}
			ret := func(c *coordinator.Coordinator, how string) (*coordinator.Released, error) {
				if how == "cancel" {
					return c.Cancel(ctx, "r", "o1")
				}
				return c.Release(ctx, "r", "o1")
			}
			var winErr error
			hook.arm(engines.Of(a).Keys.User("r", "amy"), func() {
				var r *coordinator.Released
				r, winErr = ret(b, tc.winner)
				if winErr == nil && !r.Released {
					winErr = errors.New("the first return reported released false")
				}
			})
			r, err := ret(a, tc.loser)
			if hook.fired.Load() != 1 {
				t.Fatal("the interceptor never ran the other return: the test proves nothing")
			}
			if winErr != nil {
				t.Fatalf("the first %s: %v", tc.winner, winErr)
			}
			if err != nil {
				t.Fatalf("%s racing a %s: %v; want released false", tc.loser, tc.winner, err)
			}
			if r.Released {
				t.Fatalf("%s racing a %s reported released true: the order went back twice", tc.loser, tc.winner)
			}
			if rep := mustAudit(t, b, "r"); rep.Allocated != 0 {
				t.Fatalf("audit: %d units still allocated", rep.Allocated)
			}
		})
	}
}

// overdueReservations reserves one unit per id for buyer (TTL 1 ms) and
// waits until this clock has passed every deadline.
func overdueReservations(t *testing.T, c *coordinator.Coordinator, sku, buyer string, qty int64, ids ...string) {
	t.Helper()
	var last time.Time
	for _, id := range ids {
		a, err := c.Reserve(t.Context(), sku, id, qty, "", time.Millisecond, coordinator.WithBuyer(buyer))
		if err != nil {
			t.Fatal(err)
		}
		last = a.Deadline
	}
	etcdtest.WaitFor(t, "the deadlines to pass", 10*time.Second, func() bool { return time.Now().After(last) })
}

// Invariant (issue 19, item 1): the expiry sweep racing a Confirm at the
// deadline never takes the other's return for corruption, and never
// stops. The Confirm finds its reservation past its deadline and expires it
// itself between the sweep's read of the orders and its read of the
// buyer's counter; the sweep must still expire the buyer's other overdue
// reservation, report nothing for the one the Confirm expired, and the
// Confirm says ErrExpired.
func TestSweepRacesLateConfirm(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	var hook beforeTxn
	sweeper := hookedCoordinator(t, etcd, &hook)
	payer := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, payer, "s", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100, PerUserLimit: 10})
	overdueReservations(t, payer, "s", "amy", 2, "paid-late", "abandoned")

	var confirmErr error
	hook.arm(engines.Of(sweeper).Keys.User("s", "amy"), func() {
		_, confirmErr = payer.Confirm(ctx, "s", "paid-late")
	})
	expired, err := engines.Of(sweeper).Stock.ExpireDue(ctx, "s", time.Now(), 100)
	if hook.fired.Load() != 1 {
		t.Fatal("the interceptor never ran the Confirm: the test proves nothing")
	}
	if !errors.Is(confirmErr, coordinator.ErrExpired) {
		t.Fatalf("a Confirm past the deadline: %v; want ErrExpired", confirmErr)
	}
	if err != nil {
		t.Fatalf("the sweep racing a late Confirm failed: %v", err)
	}
	if len(expired) != 1 || expired[0].Order != "abandoned" {
		t.Fatalf("the sweep expired %+v; want only the abandoned reservation", expired)
	}
	for _, id := range []string{"paid-late", "abandoned"} {
		if o := readOrder(t, payer, "s", id); o.State != segments.StateExpired {
			t.Fatalf("%s is %q, want expired", id, o.State)
		}
	}
	if rep := mustAudit(t, payer, "s"); rep.Allocated != 0 || rep.Buyers != 0 {
		t.Fatalf("audit: %d units allocated, %d buyers' counters left", rep.Allocated, rep.Buyers)
	}
}

// Invariant (issue 19, item 1): a Confirm at the deadline that expires its
// reservation itself, racing the sweep that expires it first, says
// ErrExpired (final: the units went back once), never ErrCorrupt.
func TestLateConfirmRacesSweep(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	var hook beforeTxn
	payer := hookedCoordinator(t, etcd, &hook)
	sweeper := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, sweeper, "c", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100, PerUserLimit: 10})
	overdueReservations(t, sweeper, "c", "amy", 2, "o1")

	var expired []segments.Expiry
	var sweepErr error
	hook.arm(engines.Of(payer).Keys.User("c", "amy"), func() {
		expired, sweepErr = engines.Of(sweeper).Stock.ExpireDue(ctx, "c", time.Now(), 100)
	})
	_, err := payer.Confirm(ctx, "c", "o1")
	if hook.fired.Load() != 1 {
		t.Fatal("the interceptor never ran the sweep: the test proves nothing")
	}
	if sweepErr != nil || len(expired) != 1 {
		t.Fatalf("the sweep: %v, expired %+v", sweepErr, expired)
	}
	if !errors.Is(err, coordinator.ErrExpired) {
		t.Fatalf("a Confirm past the deadline racing the sweep: %v; want ErrExpired", err)
	}
	if rep := mustAudit(t, sweeper, "c"); rep.Allocated != 0 {
		t.Fatalf("audit: %d units still allocated", rep.Allocated)
	}
}

// Invariant (issue 19, item 1), under concurrency: 24 goroutines on 4
// coordinators return one order of a limited SKU at once, by Release and
// Cancel mixed. Exactly one reports released true; every other call
// reports released false, without an error. Then overdue reservations of
// one buyer are confirmed late on three coordinators while the fourth
// sweeps: every Confirm says ErrExpired, the sweep never fails, and each
// reservation goes back once. The books balance after every round.
func TestConcurrentReturnsOfOneOrder(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 4)
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	mustCreate(t, cs[0], "storm", coordinator.SKUConfig{Total: 1000, Segments: 4, InitialFill: 1000, PerUserLimit: 50})
	const rounds, callers = 5, 24
	for round := range rounds {
		id := fmt.Sprintf("o-%d", round)
		if _, err := cs[0].Reserve(ctx, "storm", id, 2, "", time.Hour, coordinator.WithBuyer("amy")); err != nil {
			t.Fatal(err)
		}
		var released atomic.Int64
		var wg sync.WaitGroup
		for i := range callers {
			c := cs[i%len(cs)]
			wg.Go(func() {
				var r *coordinator.Released
				var err error
				if i%2 == 0 {
					r, err = c.Release(ctx, "storm", id)
				} else {
					r, err = c.Cancel(ctx, "storm", id)
				}
				if err != nil {
					t.Errorf("round %d, caller %d: %v", round, i, err)
					return
				}
				if r.Released {
					released.Add(1)
				}
			})
		}
		wg.Wait()
		if n := released.Load(); n != 1 {
			t.Fatalf("round %d: %d calls released the order, want exactly 1", round, n)
		}
		mustAudit(t, cs[0], "storm")
	}

	for round := range rounds {
		ids := make([]string, 6)
		for i := range ids {
			ids[i] = fmt.Sprintf("late-%d-%d", round, i)
		}
		overdueReservations(t, cs[0], "storm", "bob", 1, ids...)
		var sweptErr error
		var swept []segments.Expiry
		var wg sync.WaitGroup
		wg.Go(func() { swept, sweptErr = engines.Of(cs[3]).Stock.ExpireDue(ctx, "storm", time.Now(), 100) })
		for i, id := range ids {
			wg.Go(func() {
				if _, err := cs[i%3].Confirm(ctx, "storm", id); !errors.Is(err, coordinator.ErrExpired) {
					t.Errorf("round %d: late confirm of %s: %v; want ErrExpired", round, id, err)
				}
			})
		}
		wg.Wait()
		if sweptErr != nil {
			t.Fatalf("round %d: the sweep failed: %v", round, sweptErr)
		}
		seen := map[string]bool{}
		for _, x := range swept {
			if seen[x.Order] {
				t.Fatalf("round %d: %s expired twice", round, x.Order)
			}
			seen[x.Order] = true
		}
		if rep := mustAudit(t, cs[0], "storm"); rep.Reserved != 0 {
			t.Fatalf("round %d: %d units still reserved", round, rep.Reserved)
		}
	}
}

// A buyer's counter that is genuinely inconsistent with its order, at one
// revision, is still ErrCorrupt: the fix for races must not hide it.
func TestReturnWithCorruptBuyerCounter(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "k", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100, PerUserLimit: 4})
	if _, err := c.Allocate(ctx, "k", "o1", 2, "", coordinator.WithBuyer("amy")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().Put(ctx, engines.Of(c).Keys.User("k", "amy"), segments.EncodeCounter(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "k", "o1"); !errors.Is(err, coordinator.ErrCorrupt) {
		t.Fatalf("release with a buyer counter below its order: %v; want ErrCorrupt", err)
	}
}
