package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

// cartFleet sets up clusters a and b, SKUs a1, a2 in a and b1 in b (with
// the totals given), and a coordinator over them.
func cartFleet(t *testing.T, totals map[string]int64, opts ...coordinator.Option) ([]*testCluster, *coordinator.Coordinator) {
	t.Helper()
	tcs := newTestClusters(t, "a", "b")
	c := mustFleet(t, tcs, opts...)
	for _, sku := range []string{"a1", "a2", "b1"} {
		total := totals[sku]
		if _, err := c.CreateSKUIn(t.Context(), sku[:1], sku, coordinator.SKUConfig{Total: total, Segments: 2, InitialFill: total / 4}); err != nil {
			t.Fatal(err)
		}
	}
	return tcs, c
}

// wantHeld checks every SKU's audit: balanced, with the units given held by
// active orders (reserved and confirmed as given).
func wantHeld(t *testing.T, c *coordinator.Coordinator, reserved, confirmed map[string]int64) {
	t.Helper()
	for _, sku := range []string{"a1", "a2", "b1"} {
		r := mustAudit(t, c, sku)
		if r.Reserved != reserved[sku] || r.Confirmed != confirmed[sku] {
			t.Fatalf("%s: reserved %d confirmed %d, want %d and %d", sku, r.Reserved, r.Confirmed, reserved[sku], confirmed[sku])
		}
	}
}

// feedHeld reads every event of both clusters so far (a feed per cluster,
// up to the revision it is at) and returns what the consumer's table holds
// per SKU: the latest event of each order, its units if active.
func feedHeld(t *testing.T, tcs []*testCluster) map[string]int64 {
	t.Helper()
	held := map[string]int64{}
	for k, ev := range feedLast(t, tcs) {
		if ev.Kind.Active() {
			held[k.sku] += ev.Qty
		}
	}
	return held
}

type orderKey struct{ sku, order string }

// feedLast reads every event of both clusters so far and returns each
// order's latest.
func feedLast(t *testing.T, tcs []*testCluster) map[orderKey]feed.Event {
	t.Helper()
	last := map[orderKey]feed.Event{}
	for _, tc := range tcs {
		f, err := feed.Open(t.Context(), tc.raw, feed.Config{UntilOpen: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ {
			if i > 10000 {
				t.Fatal("feed did not end")
			}
			b, err := f.Next(t.Context())
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range b.Events {
				last[orderKey{ev.SKU, ev.Order}] = ev
			}
		}
		f.Close()
	}
	return last
}

// feedEqualsAudits checks that the feed consumer's table equals the audits.
func feedEqualsAudits(t *testing.T, tcs []*testCluster, c *coordinator.Coordinator) {
	t.Helper()
	held := feedHeld(t, tcs)
	for _, sku := range []string{"a1", "a2", "b1"} {
		if r := mustAudit(t, c, sku); r.Allocated != held[sku] {
			t.Fatalf("%s: the feed's table holds %d, the audit %d", sku, held[sku], r.Allocated)
		}
	}
}

// An order over two clusters applies whole: every line confirmed in its
// cluster, the records listing the whole order; a retry replays it
// (applied once); a release through any line gives back every cluster's
// lines. A reserved order over two clusters is confirmed, and another
// cancelled, through a line of either cluster.
func TestClustersCartWhole(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 10, "a2": 10, "b1": 10})
	ctx := t.Context()
	lines := []coordinator.Line{{SKU: "b1", Qty: 2}, {SKU: "a1", Qty: 1}, {SKU: "a2", Qty: 3}}
	a, err := c.AllocateOrder(ctx, "cart-1", lines)
	if err != nil {
		t.Fatal(err)
	}
	if a.Replayed || len(a.Lines) != 3 {
		t.Fatalf("first outcome %+v", a)
	}
	for i, l := range lines {
		if a.Lines[i].SKU != l.SKU || a.Lines[i].Qty != l.Qty {
			t.Fatalf("line %d: %+v, want %v", i, a.Lines[i], l)
		}
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 1, "a2": 3, "b1": 2})
	// A retry (after a lost reply) replays it, in any order of the lines.
	again, err := c.AllocateOrder(ctx, "cart-1", []coordinator.Line{lines[2], lines[0], lines[1]})
	if err != nil || !again.Replayed {
		t.Fatalf("retry: %+v, %v: want a replay", again, err)
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 1, "a2": 3, "b1": 2})
	// Other quantities under the same ID: ErrConflict, nothing changes.
	if _, err := c.AllocateOrder(ctx, "cart-1", []coordinator.Line{{SKU: "b1", Qty: 1}, {SKU: "a1", Qty: 1}, {SKU: "a2", Qty: 3}}); !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("same ID, other quantity: %v, want ErrConflict", err)
	}
	feedEqualsAudits(t, tcs, c)
	r, err := c.ReleaseOrder(ctx, "b1", "cart-1")
	if err != nil || !r.Released || len(r.Lines) != 3 {
		t.Fatalf("release through b1: %+v, %v", r, err)
	}
	wantHeld(t, c, nil, nil)

	ttl := time.Hour
	res, err := c.ReserveOrder(ctx, "cart-2", []coordinator.Line{{SKU: "a1", Qty: 2}, {SKU: "b1", Qty: 1}}, ttl)
	if err != nil || res.Lines[0].State != segments.StateReserved {
		t.Fatalf("reserve over two clusters: %+v, %v", res, err)
	}
	wantHeld(t, c, map[string]int64{"a1": 2, "b1": 1}, nil)
	if cf, err := c.ConfirmOrder(ctx, "a1", "cart-2"); err != nil || len(cf.Lines) != 2 {
		t.Fatalf("confirm through a1: %+v, %v", cf, err)
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 2, "b1": 1})
	if _, err := c.ReserveOrder(ctx, "cart-3", []coordinator.Line{{SKU: "a2", Qty: 1}, {SKU: "b1", Qty: 4}}, ttl); err != nil {
		t.Fatal(err)
	}
	if r, err := c.CancelOrder(ctx, "b1", "cart-3"); err != nil || !r.Released || len(r.Lines) != 2 {
		t.Fatalf("cancel through b1: %+v, %v", r, err)
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 2, "b1": 1})
	// The single-SKU Confirm and Release (the API's and the CLI's) of one
	// line act on every cluster's lines too.
	if _, err := c.ReserveOrder(ctx, "cart-4", []coordinator.Line{{SKU: "a2", Qty: 1}, {SKU: "b1", Qty: 1}}, ttl); err != nil {
		t.Fatal(err)
	}
	if cf, err := c.Confirm(ctx, "b1", "cart-4"); err != nil || cf.SKU != "b1" {
		t.Fatalf("Confirm of b1's line: %+v, %v", cf, err)
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 2, "a2": 1, "b1": 2})
	if r, err := c.Release(ctx, "a2", "cart-4"); err != nil || r.SKU != "a2" || !r.Released {
		t.Fatalf("Release of a2's line: %+v, %v", r, err)
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 2, "b1": 1})
	feedEqualsAudits(t, tcs, c)
}

// A line refused in the second cluster (by name) leaves nothing held in
// the first: its reservation is cancelled, and the refusal names the line
// by its index in the caller's order. The same when the refused cluster
// comes first.
func TestClustersCartRefusedInSecond(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 10, "a2": 10, "b1": 1})
	ctx := t.Context()
	for i, lines := range [][]coordinator.Line{
		{{SKU: "a1", Qty: 1}, {SKU: "a2", Qty: 1}, {SKU: "b1", Qty: 2}},
		{{SKU: "b1", Qty: 2}, {SKU: "a1", Qty: 3}},
	} {
		_, err := c.AllocateOrder(ctx, "refused-"+string(rune('0'+i)), lines)
		le, ok := errors.AsType[*coordinator.LineError](err)
		if !ok || !errors.Is(err, coordinator.ErrInsufficientStock) || le.SKU != "b1" || lines[le.Index].SKU != "b1" {
			t.Fatalf("order %d: %v, want a LineError naming b1 at its index", i, err)
		}
		wantHeld(t, c, nil, nil)
		// A retry is refused again, and still holds nothing.
		if _, err := c.AllocateOrder(ctx, "refused-"+string(rune('0'+i)), lines); !errors.Is(err, coordinator.ErrInsufficientStock) {
			t.Fatalf("retry of refused order %d: %v", i, err)
		}
		wantHeld(t, c, nil, nil)
	}
	// An earlier call reserved cluster a's lines and stopped (made here
	// through cluster a's own coordinator); the retry is refused in
	// cluster b: a's reservation is cancelled, not left until its TTL.
	lines := []coordinator.Line{{SKU: "a1", Qty: 1}, {SKU: "b1", Qty: 2}}
	if _, err := c.Cluster("a").ReserveOrder(ctx, "stopped", lines[:1], time.Hour, segments.WithAcross([]string{"a1", "b1"})); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, c, map[string]int64{"a1": 1}, nil)
	if _, err := c.AllocateOrder(ctx, "stopped", lines); !errors.Is(err, coordinator.ErrInsufficientStock) {
		t.Fatalf("retry refused in b: %v", err)
	}
	wantHeld(t, c, nil, nil)
	feedEqualsAudits(t, tcs, c)
}

// A coordinator killed between the reserves and the confirms (the hook
// stops the call there, and the process is closed) leaves the units held
// as reservations until the TTL; then each cluster's rebalancer expires
// them, and nothing is held. A retry after that gives ErrExpired and holds
// nothing; a retry before it (another order stopped the same way) goes on
// and confirms every cluster's lines, applied once.
func TestClustersCartKilledBetweenReserveAndConfirm(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 10, "a2": 10, "b1": 10})
	ctx := t.Context()
	for _, cl := range c.Clusters() {
		r, err := rebalance.New(c.Cluster(cl), rebalance.Config{Identity: "reb-" + cl, SweepInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = r.Run(rctx)
		}()
		t.Cleanup(func() {
			cancel()
			<-done
		})
	}
	lines := []coordinator.Line{{SKU: "a1", Qty: 2}, {SKU: "b1", Qty: 3}}

	// The dying process: a short TTL, stopped after its reserves.
	dying, err := newFleet(t, ctx, tcs, coordinator.WithAcrossTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	stopped := errors.New("process stopped between the reserves and the confirms")
	undo := coordinator.SetAcrossHook(func(string) error { return stopped })
	_, err = dying.AllocateOrder(ctx, "killed", lines)
	undo()
	if !errors.Is(err, stopped) {
		t.Fatalf("stopped order: %v", err)
	}
	dying.Close()
	// Held as reservations until the TTL, then expired by the sweeps.
	etcdtest.WaitFor(t, "the killed order's reservations expired in both clusters", 30*time.Second, func() bool {
		for _, sku := range []string{"a1", "b1"} {
			r, err := c.Audit(ctx, sku)
			if err != nil || !r.OK || r.Allocated != 0 || r.ExpiredOrders != 1 {
				return false
			}
		}
		return true
	})
	wantHeld(t, c, nil, nil)
	feedEqualsAudits(t, tcs, c)
	// A retry now: the order can no longer be whole.
	if _, err := c.AllocateOrder(ctx, "killed", lines); !errors.Is(err, coordinator.ErrExpired) || !errorsAsExpired(err) {
		t.Fatalf("retry after the expiry: %v, want ErrExpired", err)
	}
	wantHeld(t, c, nil, nil)

	// Stopped the same way with the default TTL (30 s), retried at once:
	// the retry confirms what the first call reserved.
	undo = coordinator.SetAcrossHook(func(string) error { return stopped })
	_, err = c.AllocateOrder(ctx, "resumed", lines)
	undo()
	if !errors.Is(err, stopped) {
		t.Fatalf("stopped order: %v", err)
	}
	a, err := c.AllocateOrder(ctx, "resumed", lines)
	if err != nil || !a.Replayed || a.Lines[0].State != segments.StateConfirmed {
		t.Fatalf("retry of the stopped order: %+v, %v", a, err)
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 2, "b1": 3})
	if a, err := c.AllocateOrder(ctx, "resumed", lines); err != nil || !a.Replayed {
		t.Fatalf("second retry: %+v, %v", a, err)
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 2, "b1": 3})
	feedEqualsAudits(t, tcs, c)
}

// Concurrent orders over two clusters on overlapping SKUs near sell-out,
// each retried once (a lost reply): no order is ever partly applied (the
// feed shows every order's lines all active or none), a refusal names a
// line, a retry of an applied order replays it, and the books balance with
// the feed's table equal to the audits and to what the callers were told.
func TestClustersCartConcurrent(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 12, "a2": 12, "b1": 12})
	other := mustFleet(t, tcs)
	ctx := t.Context()
	shapes := [][]coordinator.Line{
		{{SKU: "a1", Qty: 1}, {SKU: "b1", Qty: 2}},
		{{SKU: "b1", Qty: 1}, {SKU: "a2", Qty: 2}, {SKU: "a1", Qty: 1}},
		{{SKU: "a2", Qty: 1}, {SKU: "b1", Qty: 1}},
	}
	const workers, perWorker = 6, 5
	type outcome struct {
		lines   []coordinator.Line
		applied bool
	}
	results := make([][]outcome, workers)
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			proc := c
			if w%2 == 1 {
				proc = other
			}
			for i := range perWorker {
				id := fmt.Sprintf("w%d-%d", w, i)
				lines := shapes[(w+i)%len(shapes)]
				_, err := proc.AllocateOrder(ctx, id, lines)
				_, le := errors.AsType[*coordinator.LineError](err)
				if err != nil && !le {
					errs <- fmt.Errorf("order %s: %w", id, err)
					return
				}
				again, err2 := proc.AllocateOrder(ctx, id, lines)
				switch {
				case err == nil && (err2 != nil || !again.Replayed):
					errs <- fmt.Errorf("retry of applied order %s: %+v, %v", id, again, err2)
					return
				case err2 != nil:
					if _, le := errors.AsType[*coordinator.LineError](err2); !le {
						errs <- fmt.Errorf("retry of refused order %s: %w", id, err2)
						return
					}
				}
				// A refused order's retry may apply it: another order's
				// reservations that made it refused may have been cancelled.
				results[w] = append(results[w], outcome{lines, err == nil || err2 == nil})
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int64{}
	applied := 0
	for _, rs := range results {
		for _, r := range rs {
			if r.applied {
				applied++
				for _, l := range r.lines {
					want[l.SKU] += l.Qty
				}
			}
		}
	}
	if applied == 0 {
		t.Fatal("no order applied")
	}
	wantHeld(t, c, nil, want)
	feedEqualsAudits(t, tcs, c)
	// Every order whole or absent, as the feed shows it.
	last := feedLast(t, tcs)
	for w, rs := range results {
		for i, r := range rs {
			id := fmt.Sprintf("w%d-%d", w, i)
			n := 0
			for _, l := range r.lines {
				if ev, ok := last[orderKey{l.SKU, id}]; ok && ev.Kind.Active() {
					n++
				}
			}
			if (n != 0 && n != len(r.lines)) || (n > 0) != r.applied {
				t.Fatalf("order %s (applied %v): %d of %d lines active", id, r.applied, n, len(r.lines))
			}
		}
	}
}

func errorsAsExpired(err error) bool {
	_, ok := errors.AsType[*coordinator.ExpiredError](err)
	return ok
}
