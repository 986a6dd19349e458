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

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

// startRebalancer runs an elected rebalancer on c until the test ends.
func startRebalancer(t *testing.T, c *coordinator.Coordinator) {
	t.Helper()
	r, err := rebalance.New(c, rebalance.Config{Identity: "r", SweepInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// A SKU a process sells now and then is sold without segment locks: plain
// orders (Allocate, Reserve) of a process that holds none of the SKU's
// segments are committed directly, by a compare that the segment has no
// lock key. No lock key is ever written; an order with a route key comes
// from its home segment while it has stock; the books balance. Lazily too
// (WithLazySegments: each process takes its home over once).
func TestDirectOrdersTakeNoLock(t *testing.T) {
	t.Run("eager", func(t *testing.T) { testDirectOrdersTakeNoLock(t, coordinator.WithEagerSegments()) })
	t.Run("lazy", func(t *testing.T) { testDirectOrdersTakeNoLock(t, coordinator.WithLazySegments()) })
}

func testDirectOrdersTakeNoLock(t *testing.T, opts ...coordinator.Option) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2, opts...)
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, cs[0], "cold", coordinator.SKUConfig{Total: 40, Segments: 4, InitialFill: 40})
	locks := engines.Of(cs[0]).Keys.StockLocks("cold")
	// Each process orders with its own route key (two processes taking
	// turns on one segment would race each other's caches: see
	// TestHotSKUGrowsIntoLocks).
	homes := []int{2, 1}
	for i := range 12 {
		c, home := cs[i%2], homes[i%2]
		a, err := c.Allocate(ctx, "cold", fmt.Sprintf("o%d", i), 1, routeKeyFor(t, 4, home))
		if err != nil {
			t.Fatalf("order %d: %v", i, err)
		}
		if got, want := a.Parts[0].Place.String(), fmt.Sprintf("seg/%d", home); len(a.Parts) != 1 || got != want {
			t.Fatalf("order %d came from %v, want %s (its home, 10 units)", i, a.Parts, want)
		}
		if n := countKeys(t, raw, locks); n != 0 {
			t.Fatalf("after order %d: %d lock keys, want none", i, n)
		}
	}
	if _, err := cs[1].Reserve(ctx, "cold", "r1", 2, "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, raw, locks); n != 0 {
		t.Fatalf("after a reservation: %d lock keys, want none", n)
	}
	for _, c := range cs {
		if h := engines.Of(c).Stock.HeldSegments("cold"); len(h) != 0 {
			t.Fatalf("a coordinator holds segments %v", h)
		}
	}
	rep := mustAudit(t, cs[0], "cold")
	if rep.Allocated != 14 {
		t.Fatalf("audit allocates %d units, want 14", rep.Allocated)
	}
}

// A route key's home that another process sells lazily is not taken from
// it: B's order for A's home sells from another segment, A's counter
// still names A (no write moved it), and A's next order there sells on
// without taking it back. Before, lazy orders ignored route keys. And
// only an order without a route key takes a segment over (A's first, at
// its direct home): B's routed orders sell their segment eagerly, its
// counter exact and nobody's, so that homes spread by route keys never
// leave lazy bases lagging behind the SKU's records (docs/hotpath.md).
func TestRoutedLazyOrderLeavesAnotherOwnersHome(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2, coordinator.WithLazySegments())
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, cs[0], "shared", coordinator.SKUConfig{Total: 40, Segments: 4, InitialFill: 40})
	a, b := cs[0], cs[1]
	first, err := a.Allocate(ctx, "shared", "a-first", 1, "")
	if err != nil || len(first.Parts) != 1 || first.Parts[0].Place.IsPool() {
		t.Fatalf("A's first order: %+v, %v", first, err)
	}
	h := first.Parts[0].Place.Index()
	counter := engines.Of(a).Keys.Segment("shared", h)
	read := func(key string) (segments.SegmentCounter, int64) { return readSegmentCounter(t, raw, key) }
	owned, mod := read(counter)
	if owned.Owner == 0 {
		t.Fatalf("A's order without a route key left its segment's counter %+v, want it to name A", owned)
	}
	home := routeKeyFor(t, 4, h)
	want := first.Parts[0].Place.String()
	order := func(c *coordinator.Coordinator, id string) *coordinator.Allocation {
		t.Helper()
		al, err := c.Allocate(ctx, "shared", id, 1, home)
		if err != nil || len(al.Parts) != 1 {
			t.Fatalf("order %s: %+v, %v", id, al, err)
		}
		return al
	}
	for i := range 3 {
		if got := order(a, fmt.Sprintf("a%d", i)).Parts[0].Place.String(); got != want {
			t.Fatalf("A's order %d came from %s, want its home %s", i, got, want)
		}
	}
	if c, m := read(counter); c != owned || m != mod {
		t.Fatalf("A's routed orders at its own lazy segment wrote its counter: %+v at %d, was %+v at %d", c, m, owned, mod)
	}
	for i := range 3 {
		al := order(b, fmt.Sprintf("b%d", i))
		if got := al.Parts[0].Place.String(); got == want {
			t.Fatalf("B's order %d took A's home %s", i, want)
		}
		if al.Parts[0].Place.IsPool() {
			continue
		}
		if c, _ := read(engines.Of(b).Keys.Segment("shared", al.Parts[0].Place.Index())); c.Lazy() {
			t.Fatalf("B's routed order %d left %s lazy (%+v): a routed order must sell a segment nobody owns eagerly", i, al.Parts[0].Place, c)
		}
	}
	if c, m := read(counter); c != owned || m != mod {
		t.Fatalf("B's orders wrote A's counter: %+v at %d, was %+v at %d", c, m, owned, mod)
	}
	if got := order(a, "a3").Parts[0].Place.String(); got != want {
		t.Fatalf("A's next order came from %s, want %s", got, want)
	}
	if c, m := read(counter); c != owned || m != mod {
		t.Fatalf("A took its own home again: %+v at %d, was %+v at %d", c, m, owned, mod)
	}
	if rep := mustAudit(t, b, "shared"); rep.Allocated != 8 {
		t.Fatalf("audit allocates %d, want 8", rep.Allocated)
	}
}

// Invariant: a direct order never sells from a segment another process
// holds. A holds segment 0 of a 1-segment SKU through a long business step;
// B orders directly meanwhile, from a segment it owns for lazy sales since
// before A took the lock (A's taking marked its counter). The counter does
// not move during A's step, B's direct commits are refused, its orders are
// served only after A's hold ends (or refused at a true revision), and the
// books balance.
func TestDirectOrderNeverWritesAHeldSegment(t *testing.T) {
	t.Run("eager", func(t *testing.T) { testDirectOrderNeverWritesAHeldSegment(t, coordinator.WithEagerSegments()) })
	t.Run("lazy", func(t *testing.T) { testDirectOrderNeverWritesAHeldSegment(t, coordinator.WithLazySegments()) })
}

func testDirectOrderNeverWritesAHeldSegment(t *testing.T, opts ...coordinator.Option) {
	spy := &directSpy{locks: coordinator.DefaultPrefix + "stocklocks/"}
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(spy.intercept)))
	cs := newCoordinators(t, etcd, 2, opts...)
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, cs[0], "held", coordinator.SKUConfig{Total: 20, Segments: 1, InitialFill: 20})
	a, b := cs[0], cs[1]
	// B's direct cache of segment 0 is filled (and used) before A holds it.
	if _, err := b.Allocate(ctx, "held", "b0", 1, ""); err != nil {
		t.Fatal(err)
	}
	if spy.n.Load() != 1 || spy.refused.Load() != 0 {
		t.Fatalf("B's first order: %d direct commits (%d refused), want 1 committed", spy.n.Load(), spy.refused.Load())
	}
	counter := engines.Of(a).Keys.Segment("held", 0)
	inStep, release := make(chan struct{}), make(chan struct{})
	var during []int64
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := a.AllocateFunc(ctx, "held", "a0", 1, "", func(context.Context) error {
			close(inStep)
			<-release
			return nil
		})
		if err != nil {
			t.Errorf("A's order: %v", err)
		}
	})
	<-inStep
	before := readCounter(t, raw, counter)
	var bOutcomes sync.Map
	for i := range 5 {
		wg.Go(func() {
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := b.Allocate(octx, "held", fmt.Sprintf("b%d", i+1), 1, "")
			bOutcomes.Store(i, err)
		})
	}
	// B's orders are on their way (they wait for A's segment, which
	// alone holds stock); the counter must not move while A holds it.
	etcdtest.WaitFor(t, "B's orders to wait for the held segment", 10*time.Second, func() bool {
		return a.LocalWaiters(engines.Of(a).Keys.SegmentLock("held", 0)) > 0 || countKeys(t, raw, engines.Of(a).Keys.StockLocks("held")) > 1
	})
	during = append(during, readCounter(t, raw, counter))
	if spy.refused.Load() == 0 {
		t.Fatal("no direct commit of B was refused while A held the segment: B's cache was not put to the test")
	}
	close(release)
	wg.Wait()
	if during[0] != before {
		t.Fatalf("segment 0's counter moved from %d to %d while A held it", before, during[0])
	}
	bOutcomes.Range(func(k, v any) bool {
		if err, _ := v.(error); err != nil {
			t.Errorf("B's order %v: %v", k, err)
		}
		return true
	})
	if rep := mustAudit(t, a, "held"); rep.Allocated != 7 {
		t.Fatalf("audit allocates %d units, want 7", rep.Allocated)
	}
}

// Invariant: with direct orders racing held ones and the rebalancer, and
// one commit in every few failing (before or after etcd applied it), no
// unit is sold twice and none is refused while there: a 60-unit SKU of 4
// segments and a pool, 3 processes: one sells only with a business step
// (it holds segments), two only plain orders (sold directly while they
// hold nothing), all ordering 2× the stock, each order retried under its
// ID until served or refused. Exactly 60 orders are served, each recorded
// once, and the books balance.
func TestDirectAndHeldOrdersRace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		every   int64 // every n-th commit fails (0: none)
		applied bool
		lazy    bool // direct orders sold lazily (WithLazySegments)
	}{
		{name: "no faults"},
		{name: "replies lost", every: 4, applied: true},
		{name: "commits refused", every: 4},
		{name: "lazy, no faults", lazy: true},
		{name: "lazy, replies lost", every: 4, applied: true, lazy: true},
		{name: "lazy, commits refused", every: 4, lazy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []etcdtest.Option{etcdtest.WithNoFsync()}
			sab := &commitSaboteur{every: tc.every, applied: tc.applied, orders: coordinator.DefaultPrefix + "orders/"}
			if tc.every > 0 {
				opts = append(opts, etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(sab.intercept)))
			}
			etcd := etcdtest.NewSingle(t, opts...)
			var copts []coordinator.Option
			if tc.lazy {
				copts = append(copts, coordinator.WithLazySegments())
			} else {
				copts = append(copts, coordinator.WithEagerSegments())
			}
			cs := newCoordinators(t, etcd, 3, copts...)
			raw := etcd.Client(t)
			ctx := t.Context()
			const sku, total = "race", 60
			mustCreate(t, cs[0], sku, coordinator.SKUConfig{Total: total, Segments: 4, InitialFill: 40, RefillBatch: 3, LowWatermark: 2})
			startRebalancer(t, cs[0])

			var mu sync.Mutex
			outcomes := map[string]orderOutcome{}
			var next atomic.Int64
			var wg sync.WaitGroup
			for p, c := range cs {
				for range 6 {
					wg.Go(func() {
						for {
							n := next.Add(1)
							if n > 2*total {
								return
							}
							order := fmt.Sprintf("o%d", n)
							var o orderOutcome
							for attempt := 0; attempt < 20; attempt++ {
								var err error
								if p == 0 {
									_, err = c.AllocateFunc(ctx, sku, order, 1, "", func(context.Context) error { return nil })
								} else {
									_, err = c.Allocate(ctx, sku, order, 1, "")
								}
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
			}
			wg.Wait()
			if served := checkOutcomes(t, cs[0], raw, sku, outcomes); served != total {
				t.Fatalf("%d orders served, want exactly the %d units", served, total)
			}
			if tc.every > 0 && sab.failed.Load() == 0 {
				t.Fatal("no commit failed: the fault was not injected")
			}
		})
	}
}

// readCounter reads a stock counter (0 when absent).
func readCounter(t *testing.T, raw *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := raw.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	v, err := segments.DecodeCounter(key, resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// directSpy counts the direct commits etcd answers (transactions comparing
// a segment lock's whole key range), and those it refused, and delays each
// by delay (an etcd under load).
type directSpy struct {
	locks   string
	delay   time.Duration
	n       atomic.Int64
	refused atomic.Int64
}

func (s *directSpy) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	txn, ok := req.(*pb.TxnRequest)
	if !ok || info.FullMethod != "/etcdserverpb.KV/Txn" || !s.direct(txn) {
		return handler(ctx, req)
	}
	s.n.Add(1)
	time.Sleep(s.delay)
	resp, err := handler(ctx, req)
	if r, ok := resp.(*pb.TxnResponse); ok && err == nil && !r.Succeeded {
		s.refused.Add(1)
	}
	return resp, err
}

// direct reports whether txn is a direct commit: it writes order records
// and compares no single lock key (a held commit compares its lock key's
// revision; a direct one that its segment's lock range is empty, or, sold
// lazily, only the counters of segments its process owns).
func (s *directSpy) direct(txn *pb.TxnRequest) bool {
	for _, c := range txn.Compare {
		if strings.HasPrefix(string(c.Key), s.locks) && len(c.RangeEnd) == 0 {
			return false // a held commit's fence: its lock key
		}
	}
	orders := strings.TrimSuffix(s.locks, "stocklocks/") + "orders/"
	for _, op := range txn.Success {
		if put := op.GetRequestPut(); put != nil && strings.HasPrefix(string(put.Key), orders) {
			return true
		}
	}
	return false
}

// A SKU that turns hot in a process grows into segment locks: when many of
// its orders wait on direct commits at once (here: 48 buyers, and etcd
// slow to answer direct commits), the process takes segments and sells
// from them, as it does for a hot SKU; every order is served once.
func TestHotSKUGrowsIntoLocks(t *testing.T) {
	slow := &directSpy{locks: coordinator.DefaultPrefix + "stocklocks/", delay: 50 * time.Millisecond}
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync(), etcdtest.WithGRPCServerOptions(grpc.ChainUnaryInterceptor(slow.intercept)))
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "hot", coordinator.SKUConfig{Total: 10000, Segments: 4, InitialFill: 10000})
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 48 {
		wg.Go(func() {
			for {
				n := next.Add(1)
				if n > 480 {
					return
				}
				if _, err := c.Allocate(ctx, "hot", fmt.Sprintf("o%d", n), 1, ""); err != nil {
					t.Errorf("order %d: %v", n, err)
					return
				}
			}
		})
	}
	etcdtest.WaitFor(t, "the process to take a segment of the hot SKU", 30*time.Second, func() bool {
		return len(engines.Of(c).Stock.HeldSegments("hot")) > 0
	})
	wg.Wait()
	if slow.n.Load() == 0 {
		t.Fatal("no direct commit was made before the SKU turned hot")
	}
	if rep := mustAudit(t, c, "hot"); rep.Allocated != 480 {
		t.Fatalf("audit allocates %d units, want 480", rep.Allocated)
	}
}
