package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

// The commit decision of orders over several clusters (decision.go): a
// process stopped after the decision, or between the confirms, leaves no
// partial order once the sweeps have run; an abort racing a commit never
// lets both win; the decision records go with the orders.

// sweepNow runs cluster's expiry sweep of sku (the rebalancer's ExpireDue)
// as if every reservation were due: the sweep a TTL later, without the
// wait.
func sweepNow(t *testing.T, c *coordinator.Coordinator, cluster, sku string) []segments.Expiry {
	t.Helper()
	xs, err := engines.Of(c.Cluster(cluster)).Stock.ExpireDue(t.Context(), sku, time.Now().Add(2*time.Hour), 100)
	if err != nil {
		t.Fatalf("sweep of %s in %s: %v", sku, cluster, err)
	}
	return xs
}

// sweepAll sweeps a1 and a2 in a and b1 in b.
func sweepAll(t *testing.T, c *coordinator.Coordinator) {
	t.Helper()
	for _, sku := range []string{"a1", "a2", "b1"} {
		sweepNow(t, c, sku[:1], sku)
	}
}

// record reads order id's record at sku.
func record(t *testing.T, c *coordinator.Coordinator, sku, id string) segments.Order {
	t.Helper()
	o, err := engines.Of(c.Cluster(sku[:1])).Stock.OrderRecord(t.Context(), sku, id)
	if err != nil {
		t.Fatalf("record of %s at %s: %v", id, sku, err)
	}
	return o
}

// wantWhole checks that every line of order id (at skus) is confirmed, or
// every line given back (expired, cancelled or released), and says which.
func wantWhole(t *testing.T, c *coordinator.Coordinator, id string, skus ...string) (confirmed bool) {
	t.Helper()
	var states []string
	held := 0
	for _, sku := range skus {
		o := record(t, c, sku, id)
		switch {
		case o.Reserved():
			t.Fatalf("order %s: line %s still reserved", id, sku)
		case o.Active():
			held++
		}
		states = append(states, fmt.Sprintf("%s:%s released=%v", sku, o.State, o.Released))
	}
	if held != 0 && held != len(skus) {
		t.Fatalf("order %s is partial: %v", id, states)
	}
	return held == len(skus)
}

// decision reads order id's decision record in cluster a (its first SKU,
// a1 or a2, is there in every order of these tests): "" when there is none.
func decision(t *testing.T, tcs []*testCluster, sku, id string) string {
	t.Helper()
	resp, err := tcs[0].raw.Get(t.Context(), coordinator.DefaultPrefix+"decisions/"+sku+"/"+id)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// decisions counts the decision records in cluster a.
func decisions(t *testing.T, tcs []*testCluster) int64 {
	t.Helper()
	resp, err := tcs[0].raw.Get(t.Context(), coordinator.DefaultPrefix+"decisions/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// A process stopped after writing the commit decision, before any confirm
// (the step hook stops it there, and it is closed), or between its
// confirms (one cluster's sent, the other's not, either way round): once
// each cluster's sweep has run, every line of the order is confirmed, the
// decision's own cluster too. A retry replays the order and deletes the
// decision record; Prune archives the order.
func TestClustersCartStoppedAfterDecision(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 10, "a2": 10, "b1": 10})
	ctx := t.Context()
	lines := []coordinator.Line{{SKU: "b1", Qty: 1}, {SKU: "a1", Qty: 1}}
	stopped := errors.New("process stopped")
	for i, step := range []string{"decided", "confirm a", "confirm b"} {
		id := fmt.Sprintf("stopped-%d", i)
		dying := mustFleet(t, tcs)
		undo := coordinator.SetAcrossStepHook(func(_, s string) error {
			if s == step {
				return stopped
			}
			return nil
		})
		_, err := dying.AllocateOrder(ctx, id, lines)
		undo()
		if !errors.Is(err, stopped) {
			t.Fatalf("%s: %v, want the hook's stop", step, err)
		}
		dying.Close()
		if got := decision(t, tcs, "a1", id); got != "committed" {
			t.Fatalf("%s: decision %q, want committed", step, got)
		}
		sweepAll(t, c)
		if !wantWhole(t, c, id, "a1", "b1") {
			t.Fatalf("%s: the order was given back, want it confirmed", step)
		}
		a, err := c.AllocateOrder(ctx, id, lines)
		if err != nil || !a.Replayed || a.Lines[0].State != segments.StateConfirmed {
			t.Fatalf("%s: retry %+v, %v: want a confirmed replay", step, a, err)
		}
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 3, "b1": 3})
	feedEqualsAudits(t, tcs, c)
	// The retries found every line confirmed under a committed decision,
	// and deleted the decisions.
	if n := decisions(t, tcs); n != 0 {
		t.Fatalf("%d decision records after the retries, want 0", n)
	}
	for _, sku := range []string{"a1", "b1"} {
		if _, err := c.Prune(ctx, sku, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	for _, sku := range []string{"a1", "b1"} {
		if r := mustAudit(t, c, sku); r.Allocated != 0 || r.Archived != 3 {
			t.Fatalf("%s after the prune: %+v", sku, r)
		}
	}
}

// An order placed whole leaves no decision record; one stopped between
// the reserves and the decision is aborted by the first sweep that finds
// it due, its lines in both clusters expire, and a commit after that
// (a retry) fails with ErrExpired, giving everything back. Prune archives
// the aborted decision with the order, and not before every line of a
// committed order elsewhere is settled.
func TestClustersCartDecisionLifetime(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 10, "a2": 10, "b1": 10})
	ctx := t.Context()
	lines := []coordinator.Line{{SKU: "a1", Qty: 1}, {SKU: "b1", Qty: 1}}
	if _, err := c.AllocateOrder(ctx, "whole", lines); err != nil {
		t.Fatal(err)
	}
	if n := decisions(t, tcs); n != 0 {
		t.Fatalf("%d decision records after a whole order, want 0", n)
	}

	// Stopped before the decision: the sweep of b (not the decision's
	// cluster) finds its line due first and aborts.
	stopped := errors.New("process stopped")
	undo := coordinator.SetAcrossHook(func(string) error { return stopped })
	_, err := c.AllocateOrder(ctx, "aborted", lines)
	undo()
	if !errors.Is(err, stopped) {
		t.Fatal(err)
	}
	if xs := sweepNow(t, c, "b", "b1"); len(xs) != 1 {
		t.Fatalf("sweep of b1 expired %d, want 1", len(xs))
	}
	if got := decision(t, tcs, "a1", "aborted"); got != "aborted" {
		t.Fatalf("decision %q, want aborted", got)
	}
	// A commit now (a retry of the order, or a Confirm) cannot win: the
	// retry finds b's line expired; a Confirm of a's line, still
	// reserved, finds the decision aborted and gives it back.
	if _, err := c.ConfirmOrder(ctx, "a1", "aborted"); !errors.Is(err, coordinator.ErrExpired) {
		t.Fatalf("confirm after the abort: %v, want ErrExpired", err)
	}
	if wantWhole(t, c, "aborted", "a1", "b1") {
		t.Fatal("the aborted order is confirmed")
	}
	sweepAll(t, c)

	// Committed, stopped before b's confirm: a's record is confirmed, b's
	// reserved. Prune of a1 keeps the order and its decision (b's line
	// waits for it), and archives both once b's sweep confirmed it.
	undo = coordinator.SetAcrossStepHook(func(_, s string) error {
		if s == "confirm b" {
			return stopped
		}
		return nil
	})
	_, err = c.AllocateOrder(ctx, "half", lines)
	undo()
	if !errors.Is(err, stopped) {
		t.Fatal(err)
	}
	if _, err := c.Prune(ctx, "a1", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := decision(t, tcs, "a1", "half"); got != "committed" {
		t.Fatalf("decision after a prune with b's line reserved: %q, want committed", got)
	}
	if o := record(t, c, "a1", "half"); o.State != segments.StateConfirmed {
		t.Fatalf("a1's record of half: %+v, want it kept", o)
	}
	sweepNow(t, c, "b", "b1")
	wantWhole(t, c, "half", "a1", "b1")
	if _, err := c.Prune(ctx, "a1", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := decisions(t, tcs); n != 0 {
		t.Fatalf("%d decision records after the last prune, want 0", n)
	}
	for _, sku := range []string{"a1", "b1"} {
		if r := mustAudit(t, c, sku); r.Reserved != 0 {
			t.Fatalf("%s: %+v", sku, r)
		}
	}
}

// A reserved order over two clusters whose commit (ConfirmOrder), cancel
// (CancelOrder) and both clusters' sweeps (as if due) all race: the order
// ends whole, all confirmed or all given back, at most one of the confirm
// and the cancel succeeds, and the decision record agrees with the
// outcome. Then the books: audits balanced, the feed's table equal to
// them, and Prune leaves no decision record.
func TestClustersCartCommitRacesAbort(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 100, "a2": 100, "b1": 100})
	other := mustFleet(t, tcs)
	ctx := t.Context()
	const rounds = 12
	confirmed := 0
	for i := range rounds {
		id := fmt.Sprintf("race-%d", i)
		lines := []coordinator.Line{{SKU: "a1", Qty: 1}, {SKU: "b1", Qty: 1}}
		if i%2 == 1 {
			lines = []coordinator.Line{{SKU: "b1", Qty: 1}, {SKU: "a2", Qty: 1}, {SKU: "a1", Qty: 1}}
		}
		if _, err := c.ReserveOrder(ctx, id, lines, time.Hour); err != nil {
			t.Fatal(err)
		}
		var confirmErr, cancelErr error
		var wg sync.WaitGroup
		wg.Go(func() { _, confirmErr = c.ConfirmOrder(ctx, "b1", id) })
		if i%3 == 0 {
			wg.Go(func() { _, cancelErr = other.CancelOrder(ctx, "a1", id) })
		}
		for _, sku := range []string{"a1", "b1"} {
			wg.Go(func() {
				if _, err := engines.Of(other.Cluster(sku[:1])).Stock.ExpireDue(ctx, sku, time.Now().Add(2*time.Hour), 100); err != nil {
					t.Errorf("sweep of %s: %v", sku, err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		// A sweep that lost to the commit may find nothing; one more pass
		// settles what a racing sweep left (none is left reserved).
		sweepAll(t, c)
		skus := []string{"a1", "b1"}
		if i%2 == 1 {
			skus = append(skus, "a2")
		}
		whole := wantWhole(t, c, id, skus...)
		d := decision(t, tcs, "a1", id)
		switch {
		case confirmErr == nil && cancelErr == nil && i%3 == 0:
			t.Fatalf("%s: both the confirm and the cancel succeeded", id)
		case confirmErr == nil && !whole:
			t.Fatalf("%s: confirmed, but given back", id)
		case cancelErr == nil && i%3 == 0 && whole:
			t.Fatalf("%s: cancelled, but confirmed", id)
		case whole && d == "aborted":
			t.Fatalf("%s: confirmed under an aborted decision", id)
		case !whole && d == "committed":
			t.Fatalf("%s: given back under a committed decision", id)
		case confirmErr != nil && !errors.Is(confirmErr, coordinator.ErrExpired) && !errors.Is(confirmErr, coordinator.ErrConflict):
			t.Fatalf("%s: confirm: %v", id, confirmErr)
		case cancelErr != nil && !errors.Is(cancelErr, coordinator.ErrConflict) && !errors.Is(cancelErr, coordinator.ErrExpired):
			t.Fatalf("%s: cancel: %v", id, cancelErr)
		}
		if whole {
			confirmed++
		}
	}
	t.Logf("%d of %d raced orders confirmed, the rest given back", confirmed, rounds)
	feedEqualsAudits(t, tcs, c)
	for _, sku := range []string{"a1", "a2", "b1"} {
		if _, err := c.Prune(ctx, sku, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if r := mustAudit(t, c, sku); r.Reserved != 0 || r.Allocated != 0 && r.Confirmed == 0 {
			t.Fatalf("%s: %+v", sku, r)
		}
	}
	if n := decisions(t, tcs); n != 0 {
		t.Fatalf("%d decision records after the prune, want 0", n)
	}
}

// Many orders over two clusters from two processes, each stopped at a
// random step of its confirm (or not) and its process going on as if the
// stopped call had been its last; a sweep of both clusters as if due runs
// beside them all along. Every order ends whole.
func TestClustersCartStoppedConcurrently(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 1000, "a2": 1000, "b1": 1000})
	other := mustFleet(t, tcs)
	ctx := t.Context()
	steps := []string{"", "decided", "confirm a", "confirm b"}
	stopped := errors.New("stopped")
	undo := coordinator.SetAcrossStepHook(func(id, s string) error {
		var w, n int
		if _, err := fmt.Sscanf(id, "s%d-%d", &w, &n); err == nil && steps[(w+n)%len(steps)] == s {
			return stopped
		}
		return nil
	})
	defer undo()
	sctx, stopSweeps := context.WithCancel(ctx)
	var sweeps sync.WaitGroup
	for _, sku := range []string{"a1", "b1"} {
		sweeps.Go(func() {
			for n := 0; n < 10_000 && sctx.Err() == nil; n++ {
				_, _ = engines.Of(other.Cluster(sku[:1])).Stock.ExpireDue(sctx, sku, time.Now().Add(2*time.Hour), 100)
			}
		})
	}
	const workers, perWorker = 4, 6
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker)
	for w := range workers {
		wg.Go(func() {
			proc := c
			if w%2 == 1 {
				proc = other
			}
			for n := range perWorker {
				id := fmt.Sprintf("s%d-%d", w, n)
				_, err := proc.AllocateOrder(ctx, id, []coordinator.Line{{SKU: "a1", Qty: 1}, {SKU: "b1", Qty: 1}})
				if err != nil && !errors.Is(err, stopped) && !errors.Is(err, coordinator.ErrExpired) {
					errs <- fmt.Errorf("order %s: %w", id, err)
				}
			}
		})
	}
	wg.Wait()
	stopSweeps()
	sweeps.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sweepAll(t, c)
	whole := 0
	for w := range workers {
		for n := range perWorker {
			if wantWhole(t, c, fmt.Sprintf("s%d-%d", w, n), "a1", "b1") {
				whole++
			}
		}
	}
	t.Logf("%d of %d orders confirmed, the rest given back whole", whole, workers*perWorker)
	feedEqualsAudits(t, tcs, c)
}

// With the decision's cluster (a, the cluster of a1) stopped, an order in
// flight can be neither committed nor aborted: b's sweep leaves its line
// reserved and goes on with its other reservations, a Cancel fails naming
// a. Once a is back, the sweeps abort the order and expire both lines.
func TestClustersCartDecisionClusterDown(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 10, "a2": 10, "b1": 10})
	ctx := t.Context()
	stopped := errors.New("process stopped")
	undo := coordinator.SetAcrossHook(func(string) error { return stopped })
	_, err := c.AllocateOrder(ctx, "in-flight", []coordinator.Line{{SKU: "a1", Qty: 1}, {SKU: "b1", Qty: 2}})
	undo()
	if !errors.Is(err, stopped) {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, "b1", "plain", 1, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	tcs[0].etcd.Stop()
	if xs := sweepNow(t, c, "b", "b1"); len(xs) != 1 || xs[0].Order != "plain" {
		t.Fatalf("sweep of b1 with a down expired %+v, want the plain reservation only", xs)
	}
	if o := record(t, c, "b1", "in-flight"); !o.Reserved() {
		t.Fatalf("b1's line with the decision's cluster down: %+v, want it still reserved", o)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = c.CancelOrder(cctx, "b1", "in-flight")
	cancel()
	if !errors.Is(err, coordinator.ErrClusterUnavailable) || !strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("cancel with the decision's cluster down: %v, want ErrClusterUnavailable naming a", err)
	}
	tcs[0].etcd.Restart(t)
	etcdtest.WaitFor(t, "b's sweep aborts the order once a is back", etcdtest.MinWait, func() bool {
		xs, err := engines.Of(c.Cluster("b")).Stock.ExpireDue(ctx, "b1", time.Now().Add(2*time.Hour), 100)
		return err == nil && len(xs) == 1
	})
	if got := decision(t, tcs, "a1", "in-flight"); got != "aborted" {
		t.Fatalf("decision %q, want aborted", got)
	}
	sweepAll(t, c)
	if wantWhole(t, c, "in-flight", "a1", "b1") {
		t.Fatal("the order was confirmed")
	}
	wantHeld(t, c, nil, nil)
	feedEqualsAudits(t, tcs, c)
}

// Cancel and Release of orders over two clusters around the decision: a
// committed order stopped before its confirms cannot be cancelled (it is
// being confirmed) but is released whole; a cancelled reserved order is
// aborted, and a Confirm after it is ErrConflict, nothing confirmed. Prune
// then leaves no decision record.
func TestClustersCartCancelReleaseAroundDecision(t *testing.T) {
	tcs, c := cartFleet(t, map[string]int64{"a1": 10, "a2": 10, "b1": 10})
	ctx := t.Context()
	lines := []coordinator.Line{{SKU: "a2", Qty: 1}, {SKU: "b1", Qty: 2}}
	stopped := errors.New("process stopped")
	undo := coordinator.SetAcrossStepHook(func(_, s string) error {
		if s == "decided" {
			return stopped
		}
		return nil
	})
	_, err := c.AllocateOrder(ctx, "committed", lines)
	undo()
	if !errors.Is(err, stopped) {
		t.Fatal(err)
	}
	if _, err := c.CancelOrder(ctx, "b1", "committed"); !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("cancel of a committed order: %v, want ErrConflict", err)
	}
	if r, err := c.ReleaseOrder(ctx, "b1", "committed"); err != nil || !r.Released || len(r.Lines) != 2 {
		t.Fatalf("release of a committed order: %+v, %v", r, err)
	}
	sweepAll(t, c)
	if wantWhole(t, c, "committed", "a2", "b1") {
		t.Fatal("the released order is held")
	}

	if _, err := c.ReserveOrder(ctx, "cancelled", lines, time.Hour); err != nil {
		t.Fatal(err)
	}
	if r, err := c.CancelOrder(ctx, "a2", "cancelled"); err != nil || !r.Released {
		t.Fatalf("cancel of a reserved order: %+v, %v", r, err)
	}
	if got := decision(t, tcs, "a2", "cancelled"); got != "aborted" {
		t.Fatalf("decision after a cancel: %q, want aborted", got)
	}
	if _, err := c.ConfirmOrder(ctx, "b1", "cancelled"); !errors.Is(err, coordinator.ErrConflict) {
		t.Fatalf("confirm of a cancelled order: %v, want ErrConflict", err)
	}
	sweepAll(t, c)
	if wantWhole(t, c, "cancelled", "a2", "b1") {
		t.Fatal("the cancelled order is held")
	}
	wantHeld(t, c, nil, nil)
	feedEqualsAudits(t, tcs, c)
	for _, sku := range []string{"a2", "b1"} {
		if _, err := c.Prune(ctx, sku, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if n := decisions(t, tcs); n != 0 {
		t.Fatalf("%d decision records after the prune, want 0", n)
	}
}

// The same with the real thing: a process with a 1 s TTL stopped between
// its confirms (b's sent, a's not: a is the decision's cluster) and
// closed; each cluster's elected rebalancer, at the TTL, confirms the
// reserved line instead of expiring it.
func TestClustersCartStoppedBetweenConfirmsSweptByRebalancers(t *testing.T) {
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
	dying, err := newFleet(t, ctx, tcs, coordinator.WithAcrossTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	stopped := errors.New("process stopped between its confirms")
	undo := coordinator.SetAcrossStepHook(func(_, s string) error {
		if s == "confirm a" {
			return stopped
		}
		return nil
	})
	_, err = dying.AllocateOrder(ctx, "cut", []coordinator.Line{{SKU: "a1", Qty: 2}, {SKU: "b1", Qty: 3}})
	undo()
	if !errors.Is(err, stopped) {
		t.Fatalf("stopped order: %v", err)
	}
	dying.Close()
	if o := record(t, c, "a1", "cut"); !o.Reserved() {
		t.Fatalf("a1's line before the sweep: %+v, want it reserved", o)
	}
	etcdtest.WaitFor(t, "the rebalancers settled the order", etcdtest.MinWait, func() bool {
		for _, sku := range []string{"a1", "b1"} {
			r, err := c.Audit(ctx, sku)
			if err != nil || !r.OK || r.Reserved != 0 {
				return false
			}
		}
		return true
	})
	if !wantWhole(t, c, "cut", "a1", "b1") {
		t.Fatal("the committed order was given back")
	}
	wantHeld(t, c, nil, map[string]int64{"a1": 2, "b1": 3})
	feedEqualsAudits(t, tcs, c)
}
