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

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// orderOutcome is what a caller was told about one order, after retries
// under its ID.
type orderOutcome struct {
	served  bool
	refused bool // insufficient stock
	err     error
}

// checkOutcomes holds every order's outcome against etcd's order records:
// an order is recorded exactly when its caller was told it was served, the
// recorded units add up to the allocated units, and the books balance.
func checkOutcomes(t *testing.T, c *coordinator.Coordinator, raw *clientv3.Client, sku string, outcomes map[string]orderOutcome) (served int64) {
	t.Helper()
	for order, o := range outcomes {
		resp, err := raw.Get(context.Background(), engines.Of(c).Keys.Order(sku, order))
		if err != nil {
			t.Fatal(err)
		}
		recorded := len(resp.Kvs) > 0
		if recorded != o.served {
			t.Fatalf("order %s: recorded %v, its caller was told served=%v (err %v)", order, recorded, o.served, o.err)
		}
		if o.served {
			served++
		}
	}
	rep := mustAudit(t, c, sku)
	if rep.Allocated != served {
		t.Fatalf("audit allocates %d units, callers were served %d orders of 1", rep.Allocated, served)
	}
	return served
}

// Invariant: when a process's session ends while orders are in their step
// on its segments and earlier orders' commits are in flight (pipelined),
// every order it had not committed fails with ErrLockLost and deducts
// nothing; nothing is recorded twice; the books balance; the process sells
// again on a new session.
func TestLostLockMidPipeline(t *testing.T) {
	for i := range 3 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
			c := newCoordinators(t, etcd, 1, coordinator.WithSessionTTL(2*time.Second))[0]
			raw := etcd.Client(t)
			ctx := t.Context()
			const sku = "lost"
			mustCreate(t, c, sku, coordinator.SKUConfig{Total: 1000, Segments: 2, InitialFill: 1000})

			var mu sync.Mutex
			outcomes := map[string]orderOutcome{}
			var started atomic.Int64
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for g := range 8 {
				wg.Go(func() {
					for n := 0; ; n++ {
						select {
						case <-stop:
							return
						default:
						}
						order := fmt.Sprintf("g%d-%d", g, n)
						_, err := c.AllocateFunc(ctx, sku, order, 1, order, func(sctx context.Context) error {
							started.Add(1)
							select {
							case <-time.After(2 * time.Millisecond):
								return nil
							case <-sctx.Done():
								return context.Cause(sctx)
							}
						})
						if ctx.Err() != nil {
							return
						}
						mu.Lock()
						outcomes[order] = orderOutcome{served: err == nil, err: err}
						mu.Unlock()
						if err != nil && !errors.Is(err, coordinator.ErrLockLost) && !errors.Is(err, coordinator.ErrSessionLost) {
							t.Errorf("order %s: %v, want served or ErrLockLost", order, err)
							return
						}
					}
				})
			}
			etcdtest.WaitFor(t, "orders in their steps", 20*time.Second, func() bool { return started.Load() >= int64(50+50*i) })
			sess, err := engines.Of(c).Locks.Session(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := raw.Revoke(ctx, sess.Lease()); err != nil {
				t.Fatal(err)
			}
			// Sales go on, on a new session.
			after := started.Load()
			deadline := time.Now().Add(5 * time.Second)
			for started.Load() < after+50 {
				if time.Now().After(deadline) {
					t.Fatalf("stalled: %s", c.DebugSeller(sku))
				}
				time.Sleep(10 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			lost := 0
			for _, o := range outcomes {
				if !o.served {
					lost++
				}
			}
			served := checkOutcomes(t, c, raw, sku, outcomes)
			t.Logf("%d orders served, %d failed with the lost lock", served, lost)
		})
	}
}

// commitSaboteur is a server interceptor that fails chosen order commits:
// every nth Txn that writes an order record is either refused before etcd
// applies it, or applied with its reply lost (the caller cannot tell which).
type commitSaboteur struct {
	every   int64
	applied bool // apply before failing (a lost reply)
	n       atomic.Int64
	failed  atomic.Int64
	orders  string // key prefix of order records
}

func (s *commitSaboteur) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	txn, ok := req.(*pb.TxnRequest)
	if !ok || info.FullMethod != "/etcdserverpb.KV/Txn" || !writesPrefix(txn, s.orders) || s.n.Add(1)%s.every != 0 {
		return handler(ctx, req)
	}
	s.failed.Add(1)
	if s.applied {
		if _, err := handler(ctx, req); err != nil {
			return nil, err
		}
	}
	return nil, status.Error(codes.Unavailable, "injected: commit reply lost")
}

func writesPrefix(txn *pb.TxnRequest, prefix string) bool {
	for _, op := range txn.Success {
		if put := op.GetRequestPut(); put != nil && strings.HasPrefix(string(put.Key), prefix) {
			return true
		}
	}
	return false
}

// Invariant: a pipelined predecessor whose commit fails, before or after
// etcd applied it, never lets a successor deduct stock that is not there.
// One segment holds exactly 20 units; 8 buyers of one process run 40 orders
// with a step, retrying each under its order ID until it is served or
// refused; every 3rd commit fails. Exactly 20 orders are served (each
// recorded once), the others are refused as sold out, and the books balance.
func TestPredecessorCommitFails(t *testing.T) {
	for _, applied := range []bool{false, true} {
		t.Run(fmt.Sprintf("applied=%v", applied), func(t *testing.T) {
			sab := &commitSaboteur{every: 3, applied: applied, orders: coordinator.DefaultPrefix + "orders/"}
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(sab.intercept)))
			c := newCoordinators(t, etcd, 1)[0]
			raw := etcd.Client(t)
			ctx := t.Context()
			const sku, total = "pred", 20
			mustCreate(t, c, sku, coordinator.SKUConfig{Total: total, Segments: 1, InitialFill: total})

			var mu sync.Mutex
			outcomes := map[string]orderOutcome{}
			var next atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for {
						n := next.Add(1)
						if n > 2*total {
							return
						}
						order := fmt.Sprintf("o%d", n)
						var o orderOutcome
						for attempt := 0; attempt < 20; attempt++ {
							_, err := c.AllocateFunc(ctx, sku, order, 1, "", func(context.Context) error {
								time.Sleep(time.Millisecond)
								return nil
							})
							o = orderOutcome{served: err == nil, refused: errors.Is(err, coordinator.ErrInsufficientStock), err: err}
							if o.served || o.refused {
								break
							}
						}
						if !o.served && !o.refused {
							t.Errorf("order %s: still failing after 20 attempts: %v", order, o.err)
						}
						mu.Lock()
						outcomes[order] = o
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			served := checkOutcomes(t, c, raw, sku, outcomes)
			if served != total {
				t.Fatalf("%d orders served, want exactly the %d units", served, total)
			}
			if sab.failed.Load() == 0 {
				t.Fatal("no commit failed: the fault was not injected")
			}
			t.Logf("%d commits failed (applied=%v); %d served, %d refused", sab.failed.Load(), applied, served, int64(len(outcomes))-served)
		})
	}
}

// Invariant: a segment's lock moves between processes under load without
// losing or doubling an order. A sells alone and holds every segment; then B
// sells too, and gets its fair share (half) from A while both keep selling;
// every order is served once and the books balance.
func TestOwnershipMovesUnderLoad(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2, coordinator.WithTenure(time.Minute, 50*time.Millisecond))
	a, b := cs[0], cs[1]
	raw := etcd.Client(t)
	ctx := t.Context()
	const sku, segs = "move", 4
	mustCreate(t, a, sku, coordinator.SKUConfig{Total: 100000, Segments: segs, InitialFill: 100000})

	var mu sync.Mutex
	outcomes := map[string]orderOutcome{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	buy := func(c *coordinator.Coordinator, name string, buyers int) {
		for g := range buyers {
			wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					order := fmt.Sprintf("%s-%d-%d", name, g, n)
					_, err := c.AllocateFunc(ctx, sku, order, 1, order, func(context.Context) error {
						time.Sleep(2 * time.Millisecond)
						return nil
					})
					if err != nil {
						t.Errorf("order %s: %v", order, err)
					}
					mu.Lock()
					outcomes[order] = orderOutcome{served: err == nil, err: err}
					mu.Unlock()
				}
			})
		}
	}
	buy(a, "a", 8)
	etcdtest.WaitFor(t, "A to hold every segment", 20*time.Second, func() bool { return len(engines.Of(a).Stock.HeldSegments(sku)) == segs })
	buy(b, "b", 8)
	etcdtest.WaitFor(t, "B to hold its share", 20*time.Second, func() bool { return len(engines.Of(b).Stock.HeldSegments(sku)) == segs/2 })
	etcdtest.WaitFor(t, "A to hold its share", 20*time.Second, func() bool { return len(engines.Of(a).Stock.HeldSegments(sku)) == segs/2 })
	// Both keep selling from their halves.
	mu.Lock()
	before := len(outcomes)
	mu.Unlock()
	etcdtest.WaitFor(t, "more sales", 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(outcomes) >= before+100 })
	close(stop)
	wg.Wait()
	served := checkOutcomes(t, a, raw, sku, outcomes)
	bServed := 0
	for order, o := range outcomes {
		if o.served && strings.HasPrefix(order, "b-") {
			bServed++
		}
	}
	if bServed == 0 {
		t.Fatal("B was never served")
	}
	t.Logf("%d orders served (%d by B); A holds %v, B holds %v", served, bServed, engines.Of(a).Stock.HeldSegments(sku), engines.Of(b).Stock.HeldSegments(sku))
}

// Invariant: a process gives back the lock of a segment it stopped selling
// from after the tenure idle time, with nobody asking for it.
func TestIdleTenureReleased(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1, coordinator.WithTenure(100*time.Millisecond, coordinator.DefaultTenureMaxHold))[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, c, "idle", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
	// An order with a step takes a tenure (a plain one of a SKU this
	// process holds nothing of is sold directly, without a lock).
	noop := func(context.Context) error { return nil }
	if _, err := c.AllocateFunc(ctx, "idle", "o1", 1, "", noop); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, raw, engines.Of(c).Keys.StockLocks("idle")); n != 1 {
		t.Fatalf("%d lock keys after an order, want the one tenure", n)
	}
	etcdtest.WaitFor(t, "the idle tenure to be released", 20*time.Second, func() bool { return countKeys(t, raw, engines.Of(c).Keys.StockLocks("idle")) == 0 })
	if h := engines.Of(c).Stock.HeldSegments("idle"); len(h) != 0 {
		t.Fatalf("still holding %v", h)
	}
	// And sells again from a new tenure.
	if _, err := c.AllocateFunc(ctx, "idle", "o2", 1, "", noop); err != nil {
		t.Fatal(err)
	}
	mustAudit(t, c, "idle")
}

// Invariant: a drain of a segment this process sells from waits for the
// commits of orders that already ran their step there, then moves the rest:
// the order is served, the drain takes what it left, and the books balance.
func TestDrainWaitsForPipelinedCommits(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "dq", coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
	inStep, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := c.AllocateFunc(ctx, "dq", "o1", 3, "", func(context.Context) error {
			close(inStep)
			<-release
			return nil
		})
		if err != nil {
			t.Errorf("order: %v", err)
		}
	})
	<-inStep
	drained := make(chan int64, 1)
	wg.Go(func() {
		moved, _, err := engines.Of(c).Stock.Drain(ctx, "dq", 0, 30*time.Second)
		if err != nil {
			t.Errorf("drain: %v", err)
		}
		drained <- moved
	})
	close(release)
	wg.Wait()
	if moved := <-drained; moved != 7 {
		t.Fatalf("drain moved %d, want the 7 the order left", moved)
	}
	rep := mustAudit(t, c, "dq")
	if rep.Pool != 7 || rep.Allocated != 3 || rep.Segments != 0 {
		t.Fatalf("audit %+v", rep)
	}
}
