package rebalance_test

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
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

func newCoordinator(t *testing.T, etcd *etcdtest.Single, opts ...coordinator.Option) *coordinator.Coordinator {
	t.Helper()
	c, err := coordinator.New(etcd.Client(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// moveLog records moves by rebalancer identity.
type moveLog struct {
	mu    sync.Mutex
	moves []rebalance.Move
}

func (l *moveLog) add(m rebalance.Move) {
	l.mu.Lock()
	l.moves = append(l.moves, m)
	l.mu.Unlock()
}

func (l *moveLog) snapshot() []rebalance.Move {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]rebalance.Move(nil), l.moves...)
}

// startRebalancer runs a rebalancer until the test ends or until the
// returned stop is called; stop returns once Run has returned, so no move
// commits after it.
func startRebalancer(t *testing.T, c *coordinator.Coordinator, cfg rebalance.Config) (*rebalance.Rebalancer, func()) {
	t.Helper()
	r, err := rebalance.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	stop := func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return r, stop
}

func status(t *testing.T, c *coordinator.Coordinator, sku string) *coordinator.Status {
	t.Helper()
	st, err := c.Status(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func audit(t *testing.T, c *coordinator.Coordinator, sku string) *coordinator.AuditReport {
	t.Helper()
	r, err := c.Audit(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Fatalf("audit: %v", r.Problems)
	}
	return r
}

func routeKeyFor(t *testing.T, n, seg int) string {
	t.Helper()
	for i := 0; i < 100000; i++ {
		if k := fmt.Sprintf("user-%d", i); segments.Route(k, n) == seg {
			return k
		}
	}
	t.Fatalf("no route key for segment %d of %d", seg, n)
	return ""
}

// holdSegmentLock takes segment seg's lock of sku as another process
// would (the etcd mutex protocol the coordinator uses, on a session of its
// own, ended when the test ends) and returns it held.
func holdSegmentLock(t *testing.T, etcd *etcdtest.Single, c *coordinator.Coordinator, sku string, seg int) *concurrency.Mutex {
	t.Helper()
	sess, err := concurrency.NewSession(etcd.Client(t), concurrency.WithTTL(30))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	m := concurrency.NewMutex(sess, strings.TrimSuffix(engines.Of(c).Keys.SegmentLock(sku, seg), "/"))
	if err := m.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	return m
}

// drainedSegments is the set of segments the log's moves drained.
func drainedSegments(log *moveLog) map[int]bool {
	d := map[int]bool{}
	for _, m := range log.snapshot() {
		if m.Kind == rebalance.Drain {
			d[m.Segment] = true
		}
	}
	return d
}

// Invariant: a segment drained below its low watermark is refilled from the
// pool; the pool and the segment change by the same amount; the books
// balance; the pass is recorded where status shows it.
func TestRefillBelowWatermark(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinator(t, etcd)
	ctx := t.Context()
	if _, err := c.CreateSKU(ctx, "w", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 20, LowWatermark: 5, RefillBatch: 10}); err != nil {
		t.Fatal(err)
	}
	var log moveLog
	startRebalancer(t, c, rebalance.Config{Identity: "r1", OnMove: log.add})
	// Segments start at 10 each: above the watermark, nothing to do.
	route := routeKeyFor(t, 2, 0)
	for i := 0; i < 6; i++ { // segment 0 goes to 4 < 5
		if _, err := c.Allocate(ctx, "w", fmt.Sprintf("o%d", i), 1, route); err != nil {
			t.Fatal(err)
		}
	}
	etcdtest.WaitFor(t, "a refill of segment 0", 30*time.Second, func() bool { return len(log.snapshot()) > 0 })
	moves := log.snapshot()
	m := moves[0]
	if m.Kind != rebalance.Refill || m.Segment != 0 || m.Qty != 10 || m.Leader != "r1" {
		t.Fatalf("first move %+v, want a refill of 10 into segment 0 by r1", m)
	}
	// At the move's revision, the pool lost exactly what segment 0 gained.
	before, err := c.AuditAt(ctx, "w", m.Revision-1)
	if err != nil {
		t.Fatal(err)
	}
	after, err := c.AuditAt(ctx, "w", m.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if before.Pool-after.Pool != m.Qty || after.Segments-before.Segments != m.Qty || !after.OK {
		t.Fatalf("around the move: pool %d -> %d, segments %d -> %d", before.Pool, after.Pool, before.Segments, after.Segments)
	}
	st := status(t, c, "w")
	if st.Segments[0].Remaining != 14 || st.Pool != 70 {
		t.Fatalf("after the refill: segment 0 has %d, pool %d; want 14 and 70", st.Segments[0].Remaining, st.Pool)
	}
	etcdtest.WaitFor(t, "the pass record", 30*time.Second, func() bool { s := status(t, c, "w"); return s.Rebalancer != nil && s.Rebalancer.TotalMoves >= 1 })
	if rec := status(t, c, "w").Rebalancer; rec.Leader != "r1" || rec.TotalMoved < 10 {
		t.Fatalf("pass record %+v", rec)
	}
	audit(t, c, "w")
}

// Invariant: with three rebalancers, only the leader moves stock; when its
// lease is revoked another takes over; no move is applied twice (every move
// commits at its own revision, and the pool's losses equal the refills plus
// what orders took from the pool); the books balance.
func TestOnlyTheLeaderMovesAndFailover(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	const ttl = 2 * time.Second
	cs := make([]*coordinator.Coordinator, 3)
	rs := make([]*rebalance.Rebalancer, 3)
	stops := make([]func(), 3)
	var log moveLog
	for i := range cs {
		cs[i] = newCoordinator(t, etcd, coordinator.WithSessionTTL(ttl))
	}
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	if _, err := cs[0].CreateSKU(ctx, "f", coordinator.SKUConfig{Total: 2000, Segments: 8, InitialFill: 0, LowWatermark: 4, RefillBatch: 8}); err != nil {
		t.Fatal(err)
	}
	for i := range cs {
		rs[i], stops[i] = startRebalancer(t, cs[i], rebalance.Config{Identity: fmt.Sprintf("r%d", i), OnMove: log.add, SweepInterval: 200 * time.Millisecond})
	}
	etcdtest.WaitFor(t, "a leader", 30*time.Second, func() bool { return rs[0].Leader() || rs[1].Leader() || rs[2].Leader() })
	leader := -1
	for i, r := range rs {
		if r.Leader() {
			leader = i
		}
	}

	// Buyers keep the segments draining through the failover.
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				order := fmt.Sprintf("g%d-%d", g, n)
				_, err := cs[g%3].Allocate(ctx, "f", order, 1, order)
				if errors.Is(err, coordinator.ErrInsufficientStock) {
					return
				}
				if err != nil && !errors.Is(err, coordinator.ErrLockLost) && !errors.Is(err, coordinator.ErrSessionLost) {
					t.Error(err)
					return
				}
			}
		}()
	}
	etcdtest.WaitFor(t, "moves by the first leader", 30*time.Second, func() bool { return len(log.snapshot()) >= 10 })
	for _, m := range log.snapshot() {
		if m.Leader != fmt.Sprintf("r%d", leader) {
			t.Fatalf("move by %s while r%d led", m.Leader, leader)
		}
	}
	sess, err := engines.Of(cs[leader]).Locks.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()
	if _, err := etcd.Client(t).Revoke(ctx, sess.Lease()); err != nil {
		t.Fatal(err)
	}
	var next int
	etcdtest.WaitFor(t, "a new leader", 30*time.Second, func() bool {
		for i, r := range rs {
			if i != leader && r.Leader() {
				next = i
				return true
			}
		}
		return false
	})
	t.Logf("new leader r%d %v after the revoke", next, time.Since(revokedAt).Round(time.Millisecond))
	n := len(log.snapshot())
	etcdtest.WaitFor(t, "moves by the new leader", 30*time.Second, func() bool {
		for _, m := range log.snapshot()[n:] {
			if m.Leader == fmt.Sprintf("r%d", next) {
				return true
			}
		}
		return false
	})
	stop.Store(true)
	wg.Wait()
	// Stop every rebalancer before reading the log and the books: a refill
	// committed after the log was read would look like stock gone missing.
	for _, s := range stops {
		s()
	}

	moves := log.snapshot()
	revs := map[int64]bool{}
	var refilled, drained int64
	for _, m := range moves {
		if revs[m.Revision] && m.Kind == rebalance.Drain {
			t.Fatalf("two moves committed at revision %d", m.Revision)
		}
		revs[m.Revision] = true
		if m.Kind == rebalance.Refill {
			refilled += m.Qty
		} else {
			drained += m.Qty
		}
	}
	// The pool's losses are the refills (minus drains) plus what orders
	// took from it directly: a move applied twice would break this.
	rep := audit(t, cs[0], "f")
	fromPool := poolTakenByOrders(t, cs[0], "f")
	pulled := pulledFromPool(t, cs[0], "f")
	if 2000-rep.Pool != refilled-drained+fromPool+pulled {
		t.Fatalf("pool lost %d; refills %d − drains %d + orders from the pool %d + sellers' pulls %d = %d",
			2000-rep.Pool, refilled, drained, fromPool, pulled, refilled-drained+fromPool+pulled)
	}
	t.Logf("%d moves (%d refilled, %d drained), audit %+v", len(moves), refilled, drained, rep)
}

// pulledFromPool sums what selling processes moved from the pool into
// their segments, from every version of the pull record (etcd keeps every
// revision: the tests never compact).
func pulledFromPool(t *testing.T, c *coordinator.Coordinator, sku string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := engines.Of(c).Keys.Pull(sku)
	now, err := c.Client().Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(now.Kvs) == 0 {
		return 0
	}
	var sum int64
	for wr := range c.Client().Watch(ctx, key, clientv3.WithRev(1)) {
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		done := false
		for _, ev := range wr.Events {
			p, err := segments.DecodePull(key, ev.Kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			sum += p.Qty
			done = ev.Kv.ModRevision >= now.Kvs[0].ModRevision
		}
		if done {
			break
		}
	}
	return sum
}

// poolTakenByOrders sums what active orders took from the pool.
func poolTakenByOrders(t *testing.T, c *coordinator.Coordinator, sku string) int64 {
	t.Helper()
	resp, err := c.Client().Get(context.Background(), engines.Of(c).Keys.Orders(sku), clientv3WithPrefix()...)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, kv := range resp.Kvs {
		o, err := segments.DecodeOrder(string(kv.Key), kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range o.Parts {
			if p.Place.IsPool() && !o.Released {
				sum += p.Qty
			}
		}
	}
	return sum
}

// Invariant: 200 goroutines buying while the rebalancer hands out a pool
// holding most of the stock: no oversell, the sale completes (sold =
// total), the books balance.
func TestSaleWithRebalancer(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := []*coordinator.Coordinator{newCoordinator(t, etcd), newCoordinator(t, etcd), newCoordinator(t, etcd), newCoordinator(t, etcd)}
	// Bounded: a stuck allocation fails the test with its error instead of hanging it.
	ctx, cancel := etcdtest.HangContext(t)
	defer cancel()
	const total = 3000
	if _, err := cs[0].CreateSKU(ctx, "s", coordinator.SKUConfig{Total: total, Segments: 20, InitialFill: 200, LowWatermark: 10, RefillBatch: 30}); err != nil {
		t.Fatal(err)
	}
	var log moveLog
	startRebalancer(t, cs[0], rebalance.Config{Identity: "r", OnMove: log.add})
	var sold atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 200; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cs[g%4]
			for n := 0; ; n++ {
				order := fmt.Sprintf("g%d-%d", g, n)
				a, err := c.Allocate(ctx, "s", order, 1, order)
				if errors.Is(err, coordinator.ErrInsufficientStock) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				sold.Add(a.Qty)
			}
		}()
	}
	wg.Wait()
	if sold.Load() != total {
		t.Fatalf("sold %d, want %d", sold.Load(), total)
	}
	rep := audit(t, cs[0], "s")
	if rep.Allocated != total || rep.Pool != 0 || rep.Segments != 0 {
		t.Fatalf("final audit %+v", rep)
	}
	refills := 0
	for _, m := range log.snapshot() {
		if m.Kind == rebalance.Refill {
			refills++
		}
	}
	if refills == 0 {
		t.Fatal("the rebalancer made no refill: the sale was served by fallbacks alone")
	}
	t.Logf("%d refills", refills)
}

// Invariant: at the end of a sale, stock left in segments nobody is routed
// to is drained back to the pool, and the last units sell.
func TestEndOfSaleConsolidation(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinator(t, etcd)
	ctx := t.Context()
	// 4 segments of 10, an empty pool; all traffic goes to segment 0.
	if _, err := c.CreateSKU(ctx, "e", coordinator.SKUConfig{Total: 40, Segments: 4, InitialFill: 40, RefillBatch: 5}); err != nil {
		t.Fatal(err)
	}
	var log moveLog
	startRebalancer(t, c, rebalance.Config{Identity: "r", OnMove: log.add, IdleAfter: 300 * time.Millisecond, SweepInterval: 100 * time.Millisecond})
	route := routeKeyFor(t, 4, 0)
	for i := 0; i < 10; i++ {
		if _, err := c.Allocate(ctx, "e", fmt.Sprintf("a%d", i), 1, route); err != nil {
			t.Fatal(err)
		}
	}
	// Segment 0 is dry, the pool is empty, segments 1-3 idle: they are drained.
	drained := func() map[int]bool { return drainedSegments(&log) }
	etcdtest.WaitFor(t, "the idle segments to be drained", 30*time.Second, func() bool { d := drained(); return d[1] && d[2] && d[3] })
	if drained()[0] {
		t.Fatal("the segment with traffic was drained")
	}
	if st := status(t, c, "e"); st.Segments[1].Remaining+st.Segments[2].Remaining+st.Segments[3].Remaining != 0 {
		t.Fatalf("drained segments still hold stock: %+v", st.Segments)
	}
	// The stock is where orders routed to segment 0 take it: the pool, or
	// segment 0 refilled from it (if segment 0 had gone idle too by the
	// drain, it is parked, and the first order there pulls from the pool).
	if st := status(t, c, "e"); st.Pool+st.Segments[0].Remaining != 30 {
		t.Fatalf("after the drains: pool %d, segment 0 %d; want 30 between them", st.Pool, st.Segments[0].Remaining)
	}
	for i := 10; i < 40; i++ {
		a, err := c.Allocate(ctx, "e", fmt.Sprintf("a%d", i), 1, route)
		if err != nil {
			t.Fatalf("unit %d: %v", i, err)
		}
		for _, p := range a.Parts {
			if p.Place.Index() > 0 {
				t.Fatalf("unit %d came from a drained segment %v", i, p.Place)
			}
		}
	}
	if _, err := c.Allocate(ctx, "e", "past-the-end", 1, route); !errors.Is(err, coordinator.ErrInsufficientStock) {
		t.Fatalf("after the last unit: %v", err)
	}
	audit(t, c, "e")
}

// RunOnce makes one elected pass.
func TestRunOnce(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinator(t, etcd)
	ctx := t.Context()
	if _, err := c.CreateSKU(ctx, "o", coordinator.SKUConfig{Total: 50, Segments: 5, InitialFill: 0, RefillBatch: 3}); err != nil {
		t.Fatal(err)
	}
	r, err := rebalance.New(c, rebalance.Config{Identity: "once"})
	if err != nil {
		t.Fatal(err)
	}
	pass, err := r.RunOnce(ctx, "o")
	if err != nil {
		t.Fatal(err)
	}
	if len(pass.Moves) != 5 {
		t.Fatalf("pass %+v, want a refill of each of 5 segments", pass)
	}
	st := status(t, c, "o")
	for _, s := range st.Segments {
		if s.Remaining != 3 {
			t.Fatalf("segment %d has %d, want 3", s.Index, s.Remaining)
		}
	}
	if st.Rebalancer == nil || st.Rebalancer.Leader != "once" || st.Rebalancer.Moves != 5 {
		t.Fatalf("pass record %+v", st.Rebalancer)
	}
	if r.Leader() {
		t.Fatal("still leader after RunOnce")
	}
	if _, err := r.RunOnce(ctx, "nope"); !errors.Is(err, coordinator.ErrUnknownSKU) {
		t.Fatalf("RunOnce of an unknown SKU: %v", err)
	}
	audit(t, c, "o")
}

// Invariant (issue 28, item 7): at the end of a sale the last units are
// drained to the pool once, and stay there while nobody buys: they are not
// refilled into a dry segment nobody buys from, to be drained again
// IdleAfter later, and so on through every segment (before the fix: one
// drain every IdleAfter, up to one per segment, after every election). A
// new leader, knowing nothing of the last one's parked segments, moves the
// unit at most once each way (it may refill it into a dry segment, and
// drain it from there IdleAfter later, or leave it there if by then every
// dry segment is idle too).
func TestLeftoversDoNotWanderAfterElection(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	ctx := t.Context()
	const n, idle = 16, 100 * time.Millisecond
	buyer := newCoordinator(t, etcd)
	// One unit a segment, an empty pool; every segment but 0 sells out.
	if _, err := buyer.CreateSKU(ctx, "w", coordinator.SKUConfig{Total: n, Segments: n, InitialFill: n, RefillBatch: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		if _, err := buyer.Allocate(ctx, "w", fmt.Sprintf("o%d", i), 1, routeKeyFor(t, n, i)); err != nil {
			t.Fatal(err)
		}
	}
	if st := status(t, buyer, "w"); st.Pool != 0 || st.Segments[0].Remaining != 1 {
		t.Fatalf("setup: pool %d, segment 0 %d; want 0 and 1", st.Pool, st.Segments[0].Remaining)
	}
	buyer.Close() // its segment tenures go: every segment is free and idle
	c := newCoordinator(t, etcd)
	for term := 1; term <= 3; term++ {
		var log moveLog
		_, stop := startRebalancer(t, c, rebalance.Config{Identity: fmt.Sprintf("r%d", term), OnMove: log.add, IdleAfter: idle, SweepInterval: 20 * time.Millisecond})
		from := time.Now()
		if term == 1 {
			// The scenario: the leftover is drained to the pool.
			etcdtest.WaitFor(t, "the leftover to be drained to the pool", time.Minute, func() bool {
				for _, m := range log.snapshot() {
					if m.Kind == rebalance.Drain {
						return true
					}
				}
				return false
			})
			from = time.Now()
		}
		// A quiet while of many IdleAfters, in which the old code drained
		// and refilled the unit through one segment after another.
		etcdtest.WaitFor(t, "25 IdleAfters to pass", time.Minute, func() bool { return time.Since(from) > 25*idle })
		stop()
		drains, refills := 0, 0
		for _, m := range log.snapshot() {
			switch m.Kind {
			case rebalance.Drain:
				drains++
			case rebalance.Refill:
				refills++
			}
		}
		t.Logf("term %d: %d drains, %d refills", term, drains, refills)
		if drains > 1 || refills > 1 {
			t.Fatalf("term %d: %d drains and %d refills of the last unit; want at most one each: %+v", term, drains, refills, log.snapshot())
		}
	}
	// Somebody buys again: the unit sells.
	if _, err := c.Allocate(ctx, "w", "last", 1, routeKeyFor(t, n, 5)); err != nil {
		t.Fatal(err)
	}
	audit(t, c, "w")
}

// Invariant: the last units of a sale are drained to the pool once their
// segment is idle, even when its lock was held (a process still ending its
// tenure) while the dry segments went idle and were parked. Before, the
// pass that parked them found the stocked segment's lock busy, and no
// later pass drained it: with every dry segment parked, consolidation
// thought nothing was dry (a busy machine hit it in
// TestLeftoversDoNotWanderAfterElection: the closed process's lease was
// still being revoked).
func TestLeftoverDrainedAfterItsLockIsFreed(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	ctx := t.Context()
	const n, idle = 8, 50 * time.Millisecond
	c := newCoordinator(t, etcd)
	if _, err := c.CreateSKU(ctx, "h", coordinator.SKUConfig{Total: n, Segments: n, InitialFill: n, RefillBatch: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		if _, err := c.Allocate(ctx, "h", fmt.Sprintf("o%d", i), 1, routeKeyFor(t, n, i)); err != nil {
			t.Fatal(err)
		}
	}
	// Another process holds segment 0's lock (the etcd mutex protocol the
	// coordinator uses): the rebalancer's drains of it fail ErrLocked.
	m := holdSegmentLock(t, etcd, c, "h", 0)
	var log moveLog
	_, stop := startRebalancer(t, c, rebalance.Config{Identity: "r", OnMove: log.add, IdleAfter: idle, DrainWait: 5 * time.Millisecond,
		SweepInterval: 10 * time.Millisecond})
	defer stop()
	// Many IdleAfters: the dry segments go idle and are parked, segment 0's
	// drain keeps finding its lock held.
	from := time.Now()
	etcdtest.WaitFor(t, "20 IdleAfters to pass", time.Minute, func() bool { return time.Since(from) > 20*idle })
	if moves := log.snapshot(); len(moves) != 0 {
		t.Fatalf("moves while segment 0's lock was held and the pool empty: %+v", moves)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "the leftover to be drained once its lock was free", time.Minute, func() bool { return drainedSegments(&log)[0] })
	if st := status(t, c, "h"); st.Pool != 1 {
		t.Fatalf("pool %d after the drain, want the leftover unit", st.Pool)
	}
	audit(t, c, "h")
}

// Invariant: a consolidation drain refused because the segment's lock was
// busy is tried again once the lock is free, although the other segments'
// drains have filled the pool by then. Before (issue 28), consolidation ran
// only while the pool was empty: the busy segment's units stayed there for
// good (found on a busy machine, where an idle lock can take longer than
// DrainWait, in TestEndOfSaleConsolidation).
func TestBusyDrainRetriedAfterThePoolFilled(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	ctx := t.Context()
	c := newCoordinator(t, etcd)
	// 4 segments of 10, an empty pool; segment 0 sold out.
	if _, err := c.CreateSKU(ctx, "b", coordinator.SKUConfig{Total: 40, Segments: 4, InitialFill: 40, RefillBatch: 5}); err != nil {
		t.Fatal(err)
	}
	route := routeKeyFor(t, 4, 0)
	for i := 0; i < 10; i++ {
		if _, err := c.Allocate(ctx, "b", fmt.Sprintf("o%d", i), 1, route); err != nil {
			t.Fatal(err)
		}
	}
	// Another process holds segment 2's lock (the etcd mutex protocol the
	// coordinator uses) through the first drains.
	m := holdSegmentLock(t, etcd, c, "b", 2)
	var log moveLog
	_, stop := startRebalancer(t, c, rebalance.Config{Identity: "r", OnMove: log.add, IdleAfter: 100 * time.Millisecond,
		DrainWait: 5 * time.Millisecond, SweepInterval: 20 * time.Millisecond})
	defer stop()
	drained := func() map[int]bool { return drainedSegments(&log) }
	etcdtest.WaitFor(t, "the idle segments 1 and 3 to be drained", time.Minute, func() bool { d := drained(); return d[1] && d[3] })
	// Some passes with the pool stocked and segment 2's lock still held.
	from := time.Now()
	etcdtest.WaitFor(t, "10 IdleAfters to pass", time.Minute, func() bool { return time.Since(from) > time.Second })
	if st := status(t, c, "b"); drained()[2] || st.Segments[2].Remaining != 10 || st.Pool+st.Segments[0].Remaining != 20 {
		t.Fatalf("segment 2's lock held: drains %v, pool %d, segments %+v; want 1 and 3 drained, 20 in the pool and segment 0, 10 in segment 2",
			drained(), st.Pool, st.Segments)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "segment 2 to be drained once its lock was free", time.Minute, func() bool { return drained()[2] })
	if st := status(t, c, "b"); st.Segments[1].Remaining+st.Segments[2].Remaining+st.Segments[3].Remaining != 0 || st.Pool+st.Segments[0].Remaining != 30 {
		t.Fatalf("after the drains: pool %d, segments %+v; want 30 in the pool and segment 0", st.Pool, st.Segments)
	}
	audit(t, c, "b")
}
