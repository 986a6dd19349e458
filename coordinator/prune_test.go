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

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/segments"
)

// orderCreated reads the creation time an order's record carries.
func orderCreated(t *testing.T, c *coordinator.Coordinator, sku, order string) time.Time {
	t.Helper()
	e := engines.Of(c)
	resp, err := e.KV.Get(t.Context(), e.Keys.Order(sku, order))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read order %s: %v (%d keys)", order, err, len(resp.Kvs))
	}
	o, err := segments.DecodeOrder(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return o.Created
}

// keyCount counts the keys under a prefix.
func keyCount(t *testing.T, c *coordinator.Coordinator, prefix string) int64 {
	t.Helper()
	resp, err := engines.Of(c).KV.Get(t.Context(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// Prune archives every kind of finished order (allocated, released,
// confirmed, expired) older than the cutoff, keeps the live reservation and
// the orders from the cutoff on, and the books still balance, in Status
// and in Audit. A pruned ID is forgotten (a retry is a new order, a release
// is not found); a kept one still replays. The buyer's counter loses the
// pruned active units.
func TestPruneArchivesOldOrders(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinator(t, etcd)
	ctx := t.Context()
	mustCreate(t, c, "p", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100, PerUserLimit: 10})
	buy := func(order string, qty int64) {
		t.Helper()
		if _, err := c.Allocate(ctx, "p", order, qty, "", coordinator.WithBuyer("amy")); err != nil {
			t.Fatalf("allocate %s: %v", order, err)
		}
	}
	buy("a-1", 2)
	buy("a-2", 3)
	if _, err := c.Release(ctx, "p", "a-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, "p", "r-confirmed", 1, "", time.Hour, coordinator.WithBuyer("amy")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Confirm(ctx, "p", "r-confirmed"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, "p", "r-expired", 1, "", time.Minute, coordinator.WithBuyer("amy")); err != nil {
		t.Fatal(err)
	}
	// Expire it as the sweep would an hour from now (no waiting).
	if xs, err := engines.Of(c).Stock.ExpireDue(ctx, "p", time.Now().Add(time.Hour), 10); err != nil || len(xs) != 1 {
		t.Fatalf("expire: %v, %d expired", err, len(xs))
	}
	if _, err := c.Reserve(ctx, "p", "r-live", 1, "", time.Hour, coordinator.WithBuyer("amy")); err != nil {
		t.Fatal(err)
	}
	buy("b-1", 4) // the cutoff: this one and later are kept
	cutoff := orderCreated(t, c, "p", "b-1")
	before := mustStatus(t, c, "p")

	pr, err := c.Prune(ctx, "p", cutoff)
	if err != nil {
		t.Fatal(err)
	}
	// a-1 (2 units) and r-confirmed (1) held stock; a-2 released; r-expired expired.
	if pr.Orders != 4 || pr.Units != 3 || pr.Released != 1 || pr.Expired != 1 || pr.Buyers != 1 {
		t.Fatalf("pruned %+v, want 4 orders (3 units, 1 released, 1 expired, 1 buyer)", pr)
	}
	au := mustAudit(t, c, "p")
	st := mustStatus(t, c, "p")
	if au.Archived != 3 || au.ArchivedOrders != 4 || au.Orders != 2 || au.Reserved != 1 || au.Allocated != 5 {
		t.Fatalf("audit after prune %+v: want 3 archived units in 4 orders, 2 records (r-live, b-1) holding 5", au)
	}
	if st.Allocated != before.Allocated || st.Archived != 3 || st.ArchivedOrders != 4 || st.Orders != 2 {
		t.Fatalf("status after prune %+v (before %+v)", st, before)
	}
	// Each pruned order left its ID's claim (held for 24 h by default):
	// records that hold nothing, counted apart.
	if n := keyCount(t, c, engines.Of(c).Keys.Orders("p")); n != 6 {
		t.Fatalf("%d keys under orders/, want 2 records (r-live, b-1) and 4 pruned claims", n)
	}
	if au.PrunedClaims != 4 {
		t.Fatalf("audit counts %d pruned claims, want 4", au.PrunedClaims)
	}

	// A kept order replays; a retry of a pruned one is refused, never
	// applied again, and so is any return of it.
	if a, err := c.Allocate(ctx, "p", "b-1", 4, "", coordinator.WithBuyer("amy")); err != nil || !a.Replayed {
		t.Fatalf("retry of a kept order: %+v, %v; want a replay", a, err)
	}
	var pe *coordinator.OrderPrunedError
	if a, err := c.Allocate(ctx, "p", "a-1", 2, "", coordinator.WithBuyer("amy")); !errors.As(err, &pe) ||
		!errors.Is(err, coordinator.ErrOrderPruned) || pe.Order != "a-1" || pe.SKU != "p" || pe.Pruned.IsZero() {
		t.Fatalf("retry of a pruned order: %+v, %v; want ErrOrderPruned naming it", a, err)
	}
	if _, err := c.Reserve(ctx, "p", "r-confirmed", 1, "", time.Hour, coordinator.WithBuyer("amy")); !errors.Is(err, coordinator.ErrOrderPruned) {
		t.Fatalf("retry of a pruned reservation: %v, want ErrOrderPruned", err)
	}
	for name, ret := range map[string]func() error{
		"release": func() error { _, err := c.Release(ctx, "p", "a-1"); return err },
		"cancel":  func() error { _, err := c.Cancel(ctx, "p", "r-confirmed"); return err },
		"confirm": func() error { _, err := c.Confirm(ctx, "p", "r-confirmed"); return err },
	} {
		if err := ret(); !errors.Is(err, coordinator.ErrOrderPruned) || !errors.Is(err, coordinator.ErrOrderNotFound) {
			t.Fatalf("%s of a pruned order: %v, want ErrOrderPruned (which is also ErrOrderNotFound)", name, err)
		}
	}
	if got := mustAudit(t, c, "p"); got.Allocated != au.Allocated || got.Archived != au.Archived {
		t.Fatalf("the refused retries changed the books: %+v, before %+v", got, au)
	}

	// A retention that is not a duration is refused, changing nothing.
	if _, err := c.Prune(ctx, "p", cutoff, coordinator.KeepPrunedIDs(-time.Second)); !errors.Is(err, coordinator.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "retention of pruned order IDs") {
		t.Fatalf("prune with a negative retention: %v", err)
	}
	// A prune whose retention the claims outlived forgets them.
	forget, err := c.Prune(ctx, "p", cutoff, coordinator.KeepPrunedIDs(time.Nanosecond))
	if err != nil || forget.Orders != 0 || forget.Forgotten != 4 || forget.Archive.Orders != 4 {
		t.Fatalf("prune after the retention: %+v, %v; want 4 claims forgotten, nothing archived", forget, err)
	}
	if n := keyCount(t, c, engines.Of(c).Keys.Orders("p")); n != 2 {
		t.Fatalf("%d keys under orders/ after the claims were forgotten, want 2", n)
	}
	// amy held 2+1 (pruned) + 1 (live) + 4 = 8 of 10; her counter now says 5,
	// so 5 more fit.
	if a, err := c.Allocate(ctx, "p", "a-1", 5, "", coordinator.WithBuyer("amy")); err != nil || a.Replayed {
		t.Fatalf("a forgotten ID used again: %+v, %v; want a new order", a, err)
	}
	mustAudit(t, c, "p")

	// Nothing older than the cutoff is left: a second prune does nothing.
	again, err := c.Prune(ctx, "p", cutoff)
	if err != nil || again.Orders != 0 || again.Archive.Orders != 4 {
		t.Fatalf("second prune: %+v, %v", again, err)
	}
	if _, err := c.Prune(ctx, "nope", cutoff); !errors.Is(err, coordinator.ErrUnknownSKU) {
		t.Fatalf("prune of an unknown SKU: %v", err)
	}
}

// Prune racing a sale, releases and another pruner: every batch is one
// transaction compared against the records and the archive, so the books
// balance at the end and at every revision of the race, and no order is
// archived twice or lost.
func TestPruneDuringSale(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := []*coordinator.Coordinator{newCoordinator(t, etcd), newCoordinator(t, etcd), newCoordinator(t, etcd)}
	ctx := t.Context()
	const total = 600
	mustCreate(t, cs[0], "race", coordinator.SKUConfig{Total: total, Segments: 4, InitialFill: 200, RefillBatch: 20})
	start := mustStatus(t, cs[0], "race").Revision

	var orders atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for b := range 8 {
		wg.Go(func() {
			c := cs[b%2]
			for n := 0; ; n++ {
				id := fmt.Sprintf("o-%d-%d", b, n)
				_, err := c.Allocate(ctx, "race", id, 1, id)
				if errors.Is(err, coordinator.ErrInsufficientStock) {
					return
				}
				if err != nil {
					errs <- err
					return
				}
				orders.Add(1)
				if n%3 == 0 {
					// Some go back; the sale sells them again. A release
					// may race the pruner: one of them wins the record.
					if _, err := c.Release(ctx, "race", id); err != nil && !errors.Is(err, coordinator.ErrOrderNotFound) {
						errs <- err
						return
					}
				}
			}
		})
	}
	stopPrune := make(chan struct{})
	var pruners sync.WaitGroup
	for range 2 {
		pruners.Go(func() {
			for {
				select {
				case <-stopPrune:
					return
				default:
				}
				if _, err := cs[2].Prune(ctx, "race", time.Now()); err != nil {
					errs <- fmt.Errorf("prune during the sale: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stopPrune)
	pruners.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if _, err := cs[2].Prune(ctx, "race", time.Now()); err != nil {
		t.Fatal(err)
	}
	end := mustAudit(t, cs[0], "race")
	// A release after the last refusal may leave a unit unsold; every
	// order is archived exactly once.
	if end.Orders != 0 || end.ArchivedOrders != orders.Load() || end.Archived+end.Pool+end.Segments != total {
		t.Fatalf("final audit %+v: want all %d orders archived", end, orders.Load())
	}
	for rev := start; rev <= end.Revision; rev += max(1, (end.Revision-start)/200) {
		r, err := cs[0].AuditAt(ctx, "race", rev)
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK {
			t.Fatalf("books do not balance at revision %d: %v", rev, r.Problems)
		}
	}
}

// A SKU is deleted only when done: a live reservation or a held segment
// lock refuses it (ErrConflict, naming which, with the holder's identity);
// once nothing holds it, every key of the SKU goes, and the name can be
// created again.
func TestDeleteSKU(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	seller := newCoordinator(t, etcd, coordinator.WithIdentity("shop-7"))
	admin := newCoordinator(t, etcd)
	ctx := t.Context()
	mustCreate(t, admin, "d", coordinator.SKUConfig{Total: 50, Segments: 2, InitialFill: 20})
	// An order with a step holds its segment (a plain one of a SKU the
	// process holds nothing of is sold without a lock), and the seller
	// keeps it (its tenure) after the order.
	if _, err := seller.AllocateFunc(ctx, "d", "d-1", 2, "", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	_, err := admin.DeleteSKU(ctx, "d")
	if !errors.Is(err, coordinator.ErrConflict) || !strings.Contains(err.Error(), "shop-7") {
		t.Fatalf("delete while a segment is held: %v, want ErrConflict naming shop-7", err)
	}
	if _, err := seller.Restock(ctx, "d", "dv-1", 5); err != nil { // a delivery record and its ID claim
		t.Fatal(err)
	}
	seller.Close() // revokes its lease: its lock keys go
	if _, err := admin.Reserve(ctx, "d", "d-2", 1, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	admin = newCoordinator(t, etcd) // holds nothing
	_, err = admin.DeleteSKU(ctx, "d")
	if !errors.Is(err, coordinator.ErrConflict) || !strings.Contains(err.Error(), `reservation "d-2"`) {
		t.Fatalf("delete with a live reservation: %v, want ErrConflict naming it", err)
	}
	if _, err := admin.Cancel(ctx, "d", "d-2"); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	admin = newCoordinator(t, etcd)
	d, err := admin.DeleteSKU(ctx, "d")
	if err != nil {
		t.Fatal(err)
	}
	if d.Total != 55 || d.Remaining != 53 || d.Archived != 2 || d.Orders != 2 {
		t.Fatalf("deleted %+v: want total 55, 53 left, 2 archived units in 2 orders", d)
	}
	// Nothing of the SKU is left; the key space's space reserve stays.
	ks := engines.Of(admin).Keys
	if n := keyCount(t, admin, ks.Prefix()); n != 1 || keyCount(t, admin, ks.SpaceReserve()) != 1 {
		resp, _ := engines.Of(admin).KV.Get(ctx, ks.Prefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		t.Fatalf("%d keys left after the delete, want only the space reserve: %v", n, resp.Kvs)
	}
	if _, err := admin.Status(ctx, "d"); !errors.Is(err, coordinator.ErrUnknownSKU) {
		t.Fatalf("status of a deleted SKU: %v", err)
	}
	if _, err := admin.DeleteSKU(ctx, "d"); !errors.Is(err, coordinator.ErrUnknownSKU) {
		t.Fatalf("delete again: %v", err)
	}
	mustCreate(t, admin, "d", coordinator.SKUConfig{Total: 5, Segments: 2, InitialFill: 5})
	if a, err := admin.Allocate(ctx, "d", "d-1", 1, ""); err != nil || a.Replayed {
		t.Fatalf("an order ID of the deleted SKU: %+v, %v; want a new order", a, err)
	}
	mustAudit(t, admin, "d")
}

func newCoordinator(t *testing.T, etcd *etcdtest.Single, opts ...coordinator.Option) *coordinator.Coordinator {
	t.Helper()
	return newCoordinators(t, etcd, 1, opts...)[0]
}

// Prune racing releases on a SKU with a per-user limit answers truthfully:
// a release between prune's read of a page and of the buyers' counters is a
// race (prune reads again), never "corrupt value". Ten rounds of 40 orders
// of 4 buyers, each round pruned while half its orders are released; the
// books balance after every round.
func TestPruneRacingReleases(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	ctx := t.Context()
	mustCreate(t, cs[0], "lim", coordinator.SKUConfig{Total: 1000, Segments: 2, InitialFill: 1000, PerUserLimit: 1000})
	for round := range 10 {
		var ids []string
		for i := range 40 {
			id := fmt.Sprintf("r%d-%d", round, i)
			if _, err := cs[0].Allocate(ctx, "lim", id, 1, "", coordinator.WithBuyer(fmt.Sprintf("b%d", i%4))); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			for _, id := range ids[:20] {
				if _, err := cs[1].Release(ctx, "lim", id); err != nil && !errors.Is(err, coordinator.ErrOrderNotFound) {
					t.Errorf("release %s: %v", id, err)
				}
			}
		})
		for range 3 {
			if _, err := cs[0].Prune(ctx, "lim", time.Now().Add(time.Hour)); errors.Is(err, coordinator.ErrCorrupt) {
				t.Fatalf("round %d: prune racing releases: %v", round, err)
			} else if err != nil && !errors.Is(err, coordinator.ErrContention) {
				t.Fatalf("round %d: prune: %v", round, err)
			}
		}
		wg.Wait()
		mustAudit(t, cs[0], "lim")
	}
}

// A retried Reserve racing prune never answers "order not found": the
// order's record is its ID's claim and the replay reads it in the same
// read that finds it, so a prune between the two cannot pull it away. The
// retry of an order prune archived first is refused (ErrOrderPruned: prune
// keeps the IDs), never applied again.
func TestRetriedReserveRacingPrune(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	ctx := t.Context()
	mustCreate(t, cs[0], "rp", coordinator.SKUConfig{Total: 1000, Segments: 2, InitialFill: 1000, PerUserLimit: 1000})
	for round := range 40 {
		id := fmt.Sprintf("r%d", round)
		if _, err := cs[0].Reserve(ctx, "rp", id, 1, "", time.Hour, coordinator.WithBuyer("amy")); err != nil {
			t.Fatal(err)
		}
		if _, err := cs[0].Confirm(ctx, "rp", id); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := cs[0].Prune(ctx, "rp", time.Now().Add(time.Hour)); err != nil && !errors.Is(err, coordinator.ErrContention) {
				t.Errorf("round %d: prune: %v", round, err)
			}
		})
		_, err := cs[1].Reserve(ctx, "rp", id, 1, "", time.Hour, coordinator.WithBuyer("amy"))
		wg.Wait()
		if errors.Is(err, coordinator.ErrOrderNotFound) && !errors.Is(err, coordinator.ErrOrderPruned) {
			t.Fatalf("round %d: a retried Reserve racing prune: %v", round, err)
		}
		if err != nil && !errors.Is(err, coordinator.ErrConflict) && !errors.Is(err, coordinator.ErrOrderPruned) {
			t.Fatalf("round %d: retried Reserve: %v", round, err)
		}
	}
	mustAudit(t, cs[0], "rp")
}

// Invariant: a retry never deducts twice, even across a prune. Retries of
// applied orders, sent by another process while prune archives them, are
// each either replayed (before the prune reached the order) or refused
// with ErrOrderPruned (after): never applied as new orders. The books at
// the end count every order once.
func TestRetriesRacingPruneNeverDeductTwice(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	ctx := t.Context()
	const orders = 60
	mustCreate(t, cs[0], "rt", coordinator.SKUConfig{Total: 1000, Segments: 2, InitialFill: 1000})
	for round := range 3 {
		var ids []string
		for i := range orders {
			id := fmt.Sprintf("r%d-%d", round, i)
			if _, err := cs[0].Allocate(ctx, "rt", id, 2, ""); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := cs[0].Prune(ctx, "rt", time.Now().Add(time.Hour)); err != nil && !errors.Is(err, coordinator.ErrContention) {
				t.Errorf("round %d: prune: %v", round, err)
			}
		})
		replayed, refused := 0, 0
		for _, id := range ids {
			a, err := cs[1].Allocate(ctx, "rt", id, 2, "")
			switch {
			case err == nil && a.Replayed:
				replayed++
			case errors.Is(err, coordinator.ErrOrderPruned):
				refused++
			case err == nil:
				t.Fatalf("round %d: the retry of %s was applied again: %+v", round, id, a)
			default:
				t.Fatalf("round %d: retry of %s: %v", round, id, err)
			}
		}
		wg.Wait()
		t.Logf("round %d: %d retries replayed, %d refused as pruned", round, replayed, refused)
		au := mustAudit(t, cs[0], "rt")
		if want := int64(2 * orders * (round + 1)); au.Allocated+au.Archived != want {
			t.Fatalf("round %d: allocated %d + archived %d, want %d: an order counted twice or lost", round, au.Allocated, au.Archived, want)
		}
	}
}
