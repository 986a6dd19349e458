package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

func mustCreate(t *testing.T, c *coordinator.Coordinator, sku string, cfg coordinator.SKUConfig) {
	t.Helper()
	if _, err := c.CreateSKU(t.Context(), sku, cfg); err != nil {
		t.Fatalf("create %s: %v", sku, err)
	}
}

func mustAudit(t *testing.T, c *coordinator.Coordinator, sku string) *coordinator.AuditReport {
	t.Helper()
	r, err := c.Audit(t.Context(), sku)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Fatalf("audit of %s failed: %v", sku, r.Problems)
	}
	return r
}

func mustStatus(t *testing.T, c *coordinator.Coordinator, sku string) *coordinator.Status {
	t.Helper()
	st, err := c.Status(t.Context(), sku)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Invariants of a sale run to the end by 4 coordinators × 50 goroutines
// buying 1–3 units until told sold out:
//   - no oversell, and the sale completes: the units sold equal the total;
//   - the books balance (total = pool + segments + allocated) at the end and
//     at every revision written during the sale;
//   - no order ID is applied twice: one record per successful order, and
//     the records' quantities add up to the units sold.
func TestSaleSellsExactlyTheTotal(t *testing.T) {
	cases := []struct {
		name string
		cfg  coordinator.SKUConfig
	}{
		{"all in segments", coordinator.SKUConfig{Total: 2000, Segments: 20, InitialFill: 2000}},
		{"a quarter in the pool", coordinator.SKUConfig{Total: 2000, Segments: 20, InitialFill: 1500}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
			cs := newCoordinators(t, etcd, 4)
			raw := etcd.Client(t)
			mustCreate(t, cs[0], "hot", tc.cfg)
			start := mustStatus(t, cs[0], "hot").Revision
			// Bounded: a stuck allocation fails the test with its error.
			ctx, cancel := etcdtest.HangContext(t)
			defer cancel()

			var sold, orders atomic.Int64
			var seen sync.Map
			var wg sync.WaitGroup
			errs := make(chan error, 200)
			for ci, c := range cs {
				for g := 0; g < 50; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(ci), uint64(g)))
						for n := 0; ; n++ {
							qty := int64(1 + rng.IntN(3))
							order := fmt.Sprintf("c%d-g%d-%d", ci, g, n)
							a, err := c.Allocate(ctx, "hot", order, qty, order)
							if errors.Is(err, coordinator.ErrInsufficientStock) && qty > 1 {
								continue // maybe a smaller order still fits
							}
							if errors.Is(err, coordinator.ErrInsufficientStock) {
								return
							}
							if err != nil {
								errs <- err
								return
							}
							if a.Replayed {
								errs <- fmt.Errorf("fresh order %s reported as a replay", order)
								return
							}
							if _, dup := seen.LoadOrStore(order, a.Revision); dup {
								errs <- fmt.Errorf("order %s served twice", order)
								return
							}
							sold.Add(a.Qty)
							orders.Add(1)
						}
					}()
				}
			}
			// Audit during the sale, from another process.
			auditStop := make(chan struct{})
			auditDone := make(chan int)
			go func() {
				n := 0
				defer func() { auditDone <- n }()
				for {
					select {
					case <-auditStop:
						return
					default:
					}
					r, err := cs[3].Audit(context.Background(), "hot")
					if err != nil || !r.OK {
						errs <- fmt.Errorf("audit during the sale: %v %v", err, r)
						return
					}
					n++
				}
			}()
			wg.Wait()
			close(auditStop)
			audits := <-auditDone
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}

			if sold.Load() != tc.cfg.Total {
				t.Fatalf("sold %d units, want exactly %d", sold.Load(), tc.cfg.Total)
			}
			end := mustAudit(t, cs[0], "hot")
			if end.Allocated != tc.cfg.Total || end.Pool != 0 || end.Segments != 0 || end.Orders != orders.Load() {
				t.Fatalf("final audit %+v, want %d allocated in %d orders and nothing left", end, tc.cfg.Total, orders.Load())
			}
			// Every revision of the sale balances.
			checked := 0
			for rev := start; rev <= end.Revision; rev += max(1, (end.Revision-start)/200) {
				r, err := cs[0].AuditAt(t.Context(), "hot", rev)
				if err != nil {
					t.Fatal(err)
				}
				if !r.OK {
					t.Fatalf("books do not balance at revision %d: %v", rev, r.Problems)
				}
				checked++
			}
			// One record per order, and no other per-order key: the
			// record is the order ID's claim.
			ids, err := raw.Get(t.Context(), engines.Of(cs[0]).Keys.Orders("hot"), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			if ids.Count != orders.Load() {
				t.Fatalf("%d order records for %d orders", ids.Count, orders.Load())
			}
			legacy, err := raw.Get(t.Context(), engines.Of(cs[0]).Keys.Prefix()+"orderid/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			if legacy.Count != 0 {
				t.Fatalf("%d orderid/ claims written; an order's record is its only key", legacy.Count)
			}
			t.Logf("%d orders, %d audits during the sale, %d past revisions audited", orders.Load(), audits, checked)
		})
	}
}

// Invariant: a refusal is true. With the pool empty and the stock
// fragmented over segments so that no single place holds the quantity, a
// request for the sum succeeds by gathering; a request for one more unit is
// refused, and the refusal names a revision at which the stock was short.
func TestNoFalseSoldOut(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "frag", coordinator.SKUConfig{Total: 10, Segments: 5, InitialFill: 10})

	// Whatever segment it is routed to, no single place holds 7.
	a, err := c.Allocate(ctx, "frag", "big", 7, "user-1")
	if err != nil {
		t.Fatalf("allocating 7 of 10 fragmented units: %v", err)
	}
	if len(a.Parts) < 4 {
		t.Fatalf("7 units from %d places; each holds 2", len(a.Parts))
	}
	if _, err := c.Allocate(ctx, "frag", "rest", 3, "user-2"); err != nil {
		t.Fatalf("allocating the last 3 units: %v", err)
	}
	_, refusal := c.Allocate(ctx, "frag", "one-more", 1, "user-3")
	var short *coordinator.InsufficientStockError
	if !errors.As(refusal, &short) || !errors.Is(refusal, coordinator.ErrInsufficientStock) {
		t.Fatalf("allocating from an empty SKU: %v, want InsufficientStockError", refusal)
	}
	if short.Remaining != 0 || short.Want != 1 || short.Revision == 0 {
		t.Fatalf("refusal %+v", short)
	}
	r, err := c.AuditAt(ctx, "frag", short.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if r.Pool+r.Segments >= 1 {
		t.Fatalf("at revision %d the SKU still held %d units", short.Revision, r.Pool+r.Segments)
	}
	if !strings.Contains(refusal.Error(), fmt.Sprint(short.Revision)) {
		t.Fatalf("error %q does not name the revision", refusal)
	}
}

// Invariant: a request whose home segment is empty takes stock from the
// pool first, moved into the home segment (a short move: no order ever
// holds the pool), then from other segments, before anything is refused.
func TestFallbackOrder(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	// 4 segments of 1 unit, 2 units in the pool, refills of 1.
	mustCreate(t, c, "fb", coordinator.SKUConfig{Total: 6, Segments: 4, InitialFill: 4, RefillBatch: 1})
	route := routeKeyFor(t, 4, 0)
	want := []string{"seg/0", "seg/0", "seg/0", "seg/1", "seg/2", "seg/3"}
	pool := []int64{2, 1, 0, 0, 0, 0} // after each order
	// Orders with a step hold their segments (plain orders of a SKU this
	// process holds nothing of are sold directly: TestDirectOrders).
	noop := func(context.Context) error { return nil }
	for i, w := range want {
		a, err := c.AllocateFunc(ctx, "fb", fmt.Sprintf("o%d", i), 1, route, noop)
		if err != nil {
			t.Fatalf("order %d: %v", i, err)
		}
		if got := a.Parts[0].Place.String(); len(a.Parts) != 1 || got != w {
			t.Fatalf("order %d came from %v, want %s", i, a.Parts, w)
		}
		if st := mustStatus(t, c, "fb"); st.Pool != pool[i] {
			t.Fatalf("after order %d the pool holds %d, want %d", i, st.Pool, pool[i])
		}
	}
	if _, err := c.Allocate(ctx, "fb", "o6", 1, route); !errors.Is(err, coordinator.ErrInsufficientStock) {
		t.Fatalf("order 6 of 6 units: %v, want ErrInsufficientStock", err)
	}
	mustAudit(t, c, "fb")
}

// routeKeyFor finds a route key that routes to segment seg of n.
func routeKeyFor(t *testing.T, n, seg int) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		if k := fmt.Sprintf("user-%d", i); segments.Route(k, n) == seg {
			return k
		}
	}
	t.Fatalf("no route key found for segment %d of %d", seg, n)
	return ""
}

// Invariant: racing duplicates of one order ID deduct once, and all get the
// same answer; reuse with another quantity or SKU is a conflict.
func TestIdempotentOrders(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	ctx := t.Context()
	mustCreate(t, cs[0], "idem", coordinator.SKUConfig{Total: 100, Segments: 4, InitialFill: 100})
	mustCreate(t, cs[0], "other", coordinator.SKUConfig{Total: 100, Segments: 4, InitialFill: 100})

	for _, withStep := range []bool{false, true} {
		t.Run(fmt.Sprintf("step=%v", withStep), func(t *testing.T) {
			order := fmt.Sprintf("dup-%v", withStep)
			var steps atomic.Int32
			results := make(chan *coordinator.Allocation, 40)
			var wg sync.WaitGroup
			for i := 0; i < 40; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := cs[i%2]
					route := fmt.Sprintf("r%d", i) // duplicates land on different segments
					var a *coordinator.Allocation
					var err error
					if withStep {
						a, err = c.AllocateFunc(ctx, "idem", order, 3, route, func(context.Context) error { steps.Add(1); return nil })
					} else {
						a, err = c.Allocate(ctx, "idem", order, 3, route)
					}
					if err != nil {
						t.Error(err)
						return
					}
					results <- a
				}()
			}
			wg.Wait()
			close(results)
			fresh := 0
			var first *coordinator.Allocation
			for a := range results {
				if !a.Replayed {
					fresh++
				}
				if first == nil {
					first = a
				}
				if a.Revision != first.Revision || fmt.Sprint(a.Parts) != fmt.Sprint(first.Parts) {
					t.Fatalf("duplicates disagree: %+v vs %+v", a, first)
				}
			}
			if fresh != 1 {
				t.Fatalf("%d duplicates deducted, want 1", fresh)
			}
			if withStep && steps.Load() < 1 {
				t.Fatal("the step never ran")
			}
		})
	}
	st := mustStatus(t, cs[0], "idem")
	if st.Allocated != 6 {
		t.Fatalf("allocated %d, want 6 (two orders of 3)", st.Allocated)
	}
	if _, err := cs[0].Allocate(ctx, "idem", "dup-false", 4, ""); !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("other qty: %v, want ErrConflict", err)
	}
	// Order IDs are unique per SKU: the same ID on another SKU is another
	// order, and it deducts there.
	if a, err := cs[1].Allocate(ctx, "other", "dup-false", 3, ""); err != nil || a.Replayed {
		t.Fatalf("same ID on another SKU: %+v, %v; want a new order", a, err)
	}
	mustAudit(t, cs[0], "idem")
	mustAudit(t, cs[0], "other")
}

// Invariants of release and restock: a release returns the order's parts to
// where they came from, exactly once; a restock adds to the pool and the
// total; the books balance after each step.
func TestReleaseAndRestock(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "rr", coordinator.SKUConfig{Total: 12, Segments: 3, InitialFill: 9})

	a, err := c.Allocate(ctx, "rr", "o1", 5, "k") // more than a segment: pool
	if err != nil {
		t.Fatal(err)
	}
	before := mustStatus(t, c, "rr")
	r, err := c.Release(ctx, "rr", "o1")
	if err != nil || !r.Released || r.Qty != 5 {
		t.Fatalf("release: %+v %v", r, err)
	}
	after := mustStatus(t, c, "rr")
	for _, p := range a.Parts {
		if p.Place.IsPool() {
			if after.Pool-before.Pool != p.Qty {
				t.Fatalf("pool got back %d, want %d", after.Pool-before.Pool, p.Qty)
			}
		} else if d := after.Segments[p.Place.Index()].Remaining - before.Segments[p.Place.Index()].Remaining; d != p.Qty {
			t.Fatalf("%v got back %d, want %d", p.Place, d, p.Qty)
		}
	}
	if after.Allocated != 0 || after.Remaining() != 12 {
		t.Fatalf("after release: %+v", after)
	}
	again, err := c.Release(ctx, "rr", "o1")
	if err != nil || again.Released {
		t.Fatalf("second release: %+v %v, want Released false", again, err)
	}
	if st := mustStatus(t, c, "rr"); st.Remaining() != 12 {
		t.Fatalf("a second release returned stock: %d remain", st.Remaining())
	}
	if _, err := c.Release(ctx, "rr", "never"); !errors.Is(err, coordinator.ErrOrderNotFound) {
		t.Fatalf("release of an unknown order: %v", err)
	}
	// The released order's ID stays used.
	re, err := c.Allocate(ctx, "rr", "o1", 5, "k")
	if err != nil || !re.Replayed || !re.Released {
		t.Fatalf("allocating a released order ID again: %+v %v, want a replay marked released", re, err)
	}
	// (Selling may have moved pool stock into a segment meanwhile: the
	// pool is read again.)
	pre := mustStatus(t, c, "rr")
	res, err := c.Restock(ctx, "rr", "d1", 8)
	if err != nil || res.Total != 20 || res.Pool != pre.Pool+8 {
		t.Fatalf("restock: %+v %v (pool before %d)", res, err, pre.Pool)
	}
	rep := mustAudit(t, c, "rr")
	if rep.Total != 20 || rep.Allocated != 0 || rep.ReleasedOrders != 1 {
		t.Fatalf("audit after restock: %+v", rep)
	}
}

// Invariant: bad input gets an error that names the field, and changes
// nothing (the etcd revision does not move).
func TestBadInputChangesNothing(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, c, "ok", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
	if _, err := c.Allocate(ctx, "ok", "existing", 1, ""); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 200)
	cases := []struct {
		name  string
		call  func() error
		want  error
		field string
	}{
		{"empty sku", func() error { _, err := c.Allocate(ctx, "", "o", 1, ""); return err }, coordinator.ErrInvalidArgument, "sku"},
		{"sku with slash", func() error { _, err := c.Allocate(ctx, "a/b", "o", 1, ""); return err }, coordinator.ErrInvalidArgument, "sku"},
		{"sku with control char", func() error { _, err := c.Allocate(ctx, "a\nb", "o", 1, ""); return err }, coordinator.ErrInvalidArgument, "sku"},
		{"sku too long", func() error { _, err := c.Allocate(ctx, long, "o", 1, ""); return err }, coordinator.ErrInvalidArgument, "sku"},
		{"sku dot-dot", func() error { _, err := c.Status(ctx, ".."); return err }, coordinator.ErrInvalidArgument, "sku"},
		{"zero qty", func() error { _, err := c.Allocate(ctx, "ok", "o", 0, ""); return err }, coordinator.ErrInvalidArgument, "qty"},
		{"negative qty", func() error { _, err := c.Allocate(ctx, "ok", "o", -3, ""); return err }, coordinator.ErrInvalidArgument, "qty"},
		{"huge qty", func() error { _, err := c.Allocate(ctx, "ok", "o", segments.MaxQty+1, ""); return err }, coordinator.ErrInvalidArgument, "qty"},
		{"empty order", func() error { _, err := c.Allocate(ctx, "ok", "", 1, ""); return err }, coordinator.ErrInvalidArgument, "order"},
		{"order with space", func() error { _, err := c.Allocate(ctx, "ok", "a b", 1, ""); return err }, coordinator.ErrInvalidArgument, "order"},
		{"order too long", func() error { _, err := c.Allocate(ctx, "ok", long, 1, ""); return err }, coordinator.ErrInvalidArgument, "order"},
		{"route key too long", func() error {
			_, err := c.Allocate(ctx, "ok", "o", 1, strings.Repeat("r", segments.MaxRouteKeyLen+1))
			return err
		}, coordinator.ErrInvalidArgument, "route key"},
		{"nil step", func() error { _, err := c.AllocateFunc(ctx, "ok", "o", 1, "", nil); return err }, coordinator.ErrInvalidArgument, "step"},
		{"unknown sku", func() error { _, err := c.Allocate(ctx, "nope", "o", 1, ""); return err }, coordinator.ErrUnknownSKU, "nope"},
		{"create existing", func() error {
			_, err := c.CreateSKU(ctx, "ok", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
			return err
		}, coordinator.ErrConflict, "exists"},
		{"create zero segments", func() error { _, err := c.CreateSKU(ctx, "n0", coordinator.SKUConfig{Total: 1}); return err }, coordinator.ErrInvalidArgument, "segments"},
		{"create too many segments", func() error {
			_, err := c.CreateSKU(ctx, "n1", coordinator.SKUConfig{Total: 1, Segments: segments.MaxSegments + 1})
			return err
		}, coordinator.ErrInvalidArgument, "segments"},
		{"create negative total", func() error {
			_, err := c.CreateSKU(ctx, "n2", coordinator.SKUConfig{Total: -1, Segments: 1})
			return err
		}, coordinator.ErrInvalidArgument, "total"},
		{"create total overflow", func() error {
			_, err := c.CreateSKU(ctx, "n3", coordinator.SKUConfig{Total: segments.MaxTotal + 1, Segments: 1})
			return err
		}, coordinator.ErrInvalidArgument, "total"},
		{"create fill above total", func() error {
			_, err := c.CreateSKU(ctx, "n4", coordinator.SKUConfig{Total: 5, Segments: 1, InitialFill: 6})
			return err
		}, coordinator.ErrInvalidArgument, "initial fill"},
		{"create negative watermark", func() error {
			_, err := c.CreateSKU(ctx, "n5", coordinator.SKUConfig{Total: 5, Segments: 1, LowWatermark: -1})
			return err
		}, coordinator.ErrInvalidArgument, "low watermark"},
		{"restock zero", func() error { _, err := c.Restock(ctx, "ok", "d0", 0); return err }, coordinator.ErrInvalidArgument, "qty"},
		{"restock past the maximum", func() error {
			_, err := c.Restock(ctx, "ok", "dmax", segments.MaxQty)
			if err != nil {
				return err
			}
			return errors.New("restock accepted")
		}, nil, ""},
		{"restock without a delivery", func() error { _, err := c.Restock(ctx, "ok", "", 1); return err }, coordinator.ErrInvalidArgument, "delivery"},
		{"restock bad delivery", func() error { _, err := c.Restock(ctx, "ok", "a/b", 1); return err }, coordinator.ErrInvalidArgument, "delivery"},
		{"release unknown order", func() error { _, err := c.Release(ctx, "ok", "never"); return err }, coordinator.ErrOrderNotFound, "never"},
		{"release bad order id", func() error { _, err := c.Release(ctx, "ok", "a/b"); return err }, coordinator.ErrInvalidArgument, "order"},
		{"reuse order with other qty", func() error { _, err := c.Allocate(ctx, "ok", "existing", 2, ""); return err }, coordinator.ErrConflict, "qty"},
		{"insufficient stock", func() error { _, err := c.Allocate(ctx, "ok", "toomuch", 50, ""); return err }, coordinator.ErrInsufficientStock, "want 50"},
	}
	for _, tc := range cases {
		if tc.want == nil {
			continue // not a bad input (kept to show the limit is about the total, below)
		}
		t.Run(tc.name, func(t *testing.T) {
			before := stateDigest(t, raw, c)
			err := tc.call()
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name %q", err, tc.field)
			}
			if after := stateDigest(t, raw, c); after != before {
				t.Fatalf("the bad input changed the stored state:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
	mustAudit(t, c, "ok")
}

// Invariant: a value that does not decode is reported with its key, and
// nothing is written.
func TestCorruptValueStopsWrites(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, c, "cor", coordinator.SKUConfig{Total: 4, Segments: 2, InitialFill: 4})
	segKey := engines.Of(c).Keys.Segment("cor", 0)
	if _, err := raw.Put(ctx, segKey, "lots"); err != nil {
		t.Fatal(err)
	}
	before := stateDigest(t, raw, c)
	_, err := c.Allocate(ctx, "cor", "o", 1, routeKeyFor(t, 2, 0))
	var corrupt *segments.CorruptError
	if !errors.As(err, &corrupt) || !errors.Is(err, coordinator.ErrCorrupt) || corrupt.Key != segKey || !strings.Contains(err.Error(), segKey) {
		t.Fatalf("allocate over a corrupt segment: %v, want a CorruptError naming %s", err, segKey)
	}
	if after := stateDigest(t, raw, c); after != before {
		t.Fatalf("something was written after reading a corrupt value:\nbefore %s\nafter  %s", before, after)
	}
	r, err := c.Audit(ctx, "cor")
	if err != nil {
		t.Fatal(err)
	}
	if r.OK || !strings.Contains(strings.Join(r.Problems, "\n"), segKey) {
		t.Fatalf("audit did not report the corrupt key: %+v", r)
	}
	if _, err := c.Status(ctx, "cor"); !errors.Is(err, coordinator.ErrCorrupt) {
		t.Fatalf("status over a corrupt key: %v", err)
	}
}

// Invariants of AllocateFunc: steps of one segment never overlap; a failing
// step deducts nothing and its error is returned; a step whose lock is lost
// sees its ctx cancelled and nothing is deducted.
func TestAllocateFunc(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	raw := etcd.Client(t)
	ctx := t.Context()
	mustCreate(t, cs[0], "fn", coordinator.SKUConfig{Total: 100, Segments: 1, InitialFill: 100})

	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := cs[i%2].AllocateFunc(ctx, "fn", fmt.Sprintf("s%d", i), 1, "", func(context.Context) error {
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				defer inside.Add(-1)
				for j := 0; j < 1000; j++ {
					_ = j * j // some work while holding the segment
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Fatalf("%d steps overlapped on one segment", overlaps.Load())
	}

	boom := errors.New("card declined")
	if _, err := cs[0].AllocateFunc(ctx, "fn", "declined", 1, "", func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("failing step: %v, want its error", err)
	}
	if st := mustStatus(t, cs[0], "fn"); st.Allocated != 20 {
		t.Fatalf("allocated %d after a failed step, want 20", st.Allocated)
	}

	// Lose the lock in the middle of the step: revoke the lease.
	_, err := cs[0].AllocateFunc(ctx, "fn", "lost", 1, "", func(sctx context.Context) error {
		l := leaseOfSegmentLock(t, raw, cs[0], "fn", 0)
		if _, err := raw.Revoke(ctx, l); err != nil {
			return err
		}
		<-sctx.Done() // cancelled when the loss is noticed
		return context.Cause(sctx)
	})
	if !errors.Is(err, coordinator.ErrLockLost) {
		t.Fatalf("step losing its lock: %v, want ErrLockLost", err)
	}
	if st := mustStatus(t, cs[0], "fn"); st.Allocated != 20 {
		t.Fatalf("allocated %d after a lost lock, want 20", st.Allocated)
	}
	if resp, err := raw.Get(ctx, engines.Of(cs[0]).Keys.Order("fn", "lost")); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the lost order left a record (%v): it must deduct nothing", err)
	}
	// The coordinator recovers on a new session.
	if _, err := cs[0].AllocateFunc(ctx, "fn", "after", 1, "", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("after the loss: %v", err)
	}
	mustAudit(t, cs[0], "fn")
}

// leaseOfSegmentLock returns the lease of the current holder of a segment lock.
func leaseOfSegmentLock(t *testing.T, raw *clientv3.Client, c *coordinator.Coordinator, sku string, seg int) clientv3.LeaseID {
	resp, err := raw.Get(context.Background(), engines.Of(c).Keys.SegmentLock(sku, seg), clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		all, _ := raw.Get(context.Background(), engines.Of(c).Keys.Prefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		for _, kv := range all.Kvs {
			t.Logf("key %s create %d mod %d lease %x", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Lease)
		}
		t.Logf("queue: %s; rev %d", c.DebugQueue(sku, seg), all.Header.Revision)
		t.Errorf("no holder of segment %d: %v", seg, err)
		return 0
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// Invariant: concurrent plain allocations in one process on one segment are
// committed in shared transactions (group commit): fewer commit revisions
// than orders, each order with its own record.
func TestGroupCommit(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	ctx := t.Context()
	mustCreate(t, c, "gc", coordinator.SKUConfig{Total: 1000, Segments: 1, InitialFill: 1000})
	revs := make(chan int64, 256)
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 4; i++ {
				a, err := c.Allocate(ctx, "gc", fmt.Sprintf("g%d-%d", g, i), 1, "")
				if err != nil {
					t.Error(err)
					return
				}
				revs <- a.Revision
			}
		}()
	}
	wg.Wait()
	close(revs)
	perRev := map[int64]int{}
	for r := range revs {
		perRev[r]++
	}
	largest := 0
	for _, n := range perRev {
		largest = max(largest, n)
	}
	if largest < 2 {
		t.Fatalf("256 concurrent orders committed in %d transactions: no group commit", len(perRev))
	}
	sizes := make([]int, 0, len(perRev))
	for _, n := range perRev {
		sizes = append(sizes, n)
	}
	sort.Ints(sizes)
	t.Logf("256 orders in %d commits, largest group %d", len(perRev), largest)
	if r := mustAudit(t, c, "gc"); r.Orders != 256 || r.Allocated != 256 {
		t.Fatalf("audit %+v, want 256 orders of 1", r)
	}
}

// stateDigest lists every meta, stock and order key with its mod revision and
// value: two equal digests mean no stock or order changed in between (lock
// keys, which any attempt writes, are left out).
func stateDigest(t *testing.T, raw *clientv3.Client, c *coordinator.Coordinator) string {
	t.Helper()
	var b strings.Builder
	for _, sub := range []string{"meta/", "stock/", "orders/", "orderid/", "rebalance/last"} {
		resp, err := raw.Get(context.Background(), engines.Of(c).Keys.Prefix()+sub, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			fmt.Fprintf(&b, "%s@%d=%s ", kv.Key, kv.ModRevision, kv.Value)
		}
	}
	return b.String()
}

// A release puts the order's units in the inbox of the segment its order
// ID routes to, whichever segment they were sold from (stock is fungible):
// the released units of a sold-out SKU, sold again from the few segments
// that sell, would otherwise all come back to those few inboxes, and
// concurrent releases refuse each other's compared writes there. Orders
// sold and released: each unit is in its own order ID's segment's inbox
// (some of them not the segment it was sold from, or the test proves
// nothing), and the books balance.
func TestReleaseGoesToTheOrderIDsSegment(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	const segs = 4
	mustCreate(t, c, "rel", coordinator.SKUConfig{Total: 40, Segments: segs, InitialFill: 40})
	want := make([]int64, segs)
	elsewhere := 0
	for i := range 8 {
		order := fmt.Sprint("o-", i)
		a, err := c.Allocate(ctx, "rel", order, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		if r, err := c.Release(ctx, "rel", order); err != nil || !r.Released {
			t.Fatalf("release %s: %+v %v", order, r, err)
		}
		to := segments.Route(order, segs)
		want[to]++
		if len(a.Parts) != 1 || a.Parts[0].Place.IsPool() || a.Parts[0].Place.Index() != to {
			elsewhere++
		}
	}
	if elsewhere == 0 {
		t.Fatal("every order was sold from the segment its ID routes to: the test proves nothing")
	}
	for i := range segs {
		if got := readCounter(t, raw, engines.Of(c).Keys.Inbox("rel", i)); got != want[i] {
			t.Errorf("inbox %d holds %d, want %d (the released orders whose IDs route there)", i, got, want[i])
		}
	}
	if rep := mustAudit(t, c, "rel"); !rep.OK || rep.Allocated != 0 {
		t.Fatalf("audit: %+v", rep)
	}
}

// A sweep's batched expiry sends every unit of a chunk to one inbox: the
// one the chunk's first order's ID routes to (not each order's own, which
// made a chunk compare many inboxes, and in a busy sale fail when a seller
// absorbed any of them). The chunk is one transaction; the books balance.
func TestBatchedExpiryReturnsToOneInbox(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	raw := etcd.Client(t)
	ctx := t.Context()
	const segs = 4
	mustCreate(t, c, "exp", coordinator.SKUConfig{Total: 40, Segments: segs, InitialFill: 40})
	routes := map[int]bool{}
	const n = 8
	for i := range n {
		order := fmt.Sprint("r-", i)
		if _, err := c.Reserve(ctx, "exp", order, 1, "", time.Hour); err != nil {
			t.Fatal(err)
		}
		routes[segments.Route(order, segs)] = true
	}
	if len(routes) < 2 {
		t.Fatal("every order's ID routes to one segment: the test proves nothing")
	}
	// Due in two hours; the first due is the first reserved (r-0).
	xs, err := engines.Of(c).Stock.ExpireDue(ctx, "exp", time.Now().Add(2*time.Hour), 100)
	if err != nil || len(xs) != n {
		t.Fatalf("ExpireDue: %d expired, %v", len(xs), err)
	}
	for _, x := range xs {
		if x.Revision != xs[0].Revision {
			t.Fatalf("expiries at revisions %d and %d: not one transaction", xs[0].Revision, x.Revision)
		}
	}
	to := segments.Route("r-0", segs)
	for i := range segs {
		want := int64(0)
		if i == to {
			want = n
		}
		if got := readCounter(t, raw, engines.Of(c).Keys.Inbox("exp", i)); got != want {
			t.Errorf("inbox %d holds %d, want %d (every unit of the chunk to inbox %d, r-0's)", i, got, want, to)
		}
	}
	if rep := mustAudit(t, c, "exp"); !rep.OK || rep.Allocated != 0 {
		t.Fatalf("audit: %+v", rep)
	}
}
