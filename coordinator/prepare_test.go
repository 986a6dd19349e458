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
)

// currentRev is etcd's revision now.
func currentRev(t *testing.T, etcd *etcdtest.Single) int64 {
	t.Helper()
	resp, err := etcd.Client(t).Get(t.Context(), "rev")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// A prepared sale's first orders write one key each, their records: the
// takeovers that a process's first order of each SKU would make (its
// counter rewritten to name the process, in the order's commit) are made
// by Prepare, many SKUs a transaction, before the sale. The same orders
// in an unprepared process write a counter beside nearly every record
// (the control), so the test fails where Prepare does nothing; in a
// process that held its seller seat before the SKUs were created
// (WithSellerSeat), they write their records alone without Prepare. The
// counters are never written by the orders; the books balance; an eager
// process's Prepare only reads.
func TestPrepareFirstOrdersWriteOneKey(t *testing.T) {
	const skus = 40
	cfg := coordinator.SKUConfig{Total: 100, Segments: 4, InitialFill: 100, LowWatermark: 1}
	for _, tc := range []struct {
		name      string
		opts      []coordinator.Option
		prepare   bool
		wantOwned int
		born      bool    // the SKUs are born with the process's homes: Prepare writes nothing
		maxKeys   float64 // keys written per order, at most
		minKeys   float64 // and at least
	}{
		{name: "lazy prepared", prepare: true, wantOwned: skus, minKeys: 1, maxKeys: 1},
		{name: "lazy unprepared", minKeys: 1.9, maxKeys: 2.05}, // 2.05: the seat's claim
		// A seller's seat held before the SKUs are created: each is born
		// with the process's home named to it, and nothing is taken over.
		{name: "lazy with a seller seat", opts: []coordinator.Option{coordinator.WithSellerSeat()}, minKeys: 1, maxKeys: 1},
		{name: "lazy prepared with a seller seat", opts: []coordinator.Option{coordinator.WithSellerSeat()}, prepare: true, wantOwned: skus,
			born: true, minKeys: 1, maxKeys: 1},
		{name: "eager prepared", opts: []coordinator.Option{coordinator.WithEagerSegments()}, prepare: true, minKeys: 2, maxKeys: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
			c := newCoordinators(t, etcd, 1, tc.opts...)[0]
			ctx := t.Context()
			var names []string
			for i := range skus {
				names = append(names, fmt.Sprintf("p%02d", i))
				mustCreate(t, c, names[i], cfg)
			}
			prefix := engines.Of(c).Keys.Prefix()
			raw := etcd.Client(t)
			if tc.prepare {
				before := currentRev(t, etcd)
				p, err := c.Prepare(ctx, names...)
				if err != nil {
					t.Fatal(err)
				}
				if p.SKUs != skus || p.Ready != skus || p.Skipped != 0 || p.Owned != tc.wantOwned {
					t.Fatalf("Prepare = %+v, want %d SKUs ready, none skipped, %d owned", *p, skus, tc.wantOwned)
				}
				// Its takeovers, and the process's seat (one key); none
				// where the homes were born the process's (its peeks adopt
				// them, its seat was claimed at New).
				wrote := keysWritten(t, raw, prefix, before, currentRev(t, etcd))
				if want := int64(tc.wantOwned); !tc.born && (wrote < want || wrote > want+1) {
					t.Fatalf("Prepare wrote %d keys; want %d takeovers and a seat", wrote, want)
				}
				if tc.born && wrote != 0 {
					t.Fatalf("Prepare wrote %d keys over SKUs born with the process's homes; want none", wrote)
				}
			}
			start := currentRev(t, etcd)
			var wg sync.WaitGroup
			for i, sku := range names {
				wg.Go(func() {
					if _, err := c.Allocate(ctx, sku, fmt.Sprint("o", i), 1, ""); err != nil {
						t.Errorf("%s: %v", sku, err)
					}
				})
			}
			wg.Wait()
			puts := keysWritten(t, raw, prefix, start, currentRev(t, etcd))
			perOrder := float64(puts) / skus
			t.Logf("%d keys written by %d first orders: %.2f an order", puts, skus, perOrder)
			if perOrder < tc.minKeys || perOrder > tc.maxKeys {
				t.Fatalf("%.2f keys written an order, want %.2f to %.2f", perOrder, tc.minKeys, tc.maxKeys)
			}
			for _, sku := range names {
				if rep := mustAudit(t, c, sku); rep.Allocated != 1 {
					t.Fatalf("%s: audit allocates %d, want 1", sku, rep.Allocated)
				}
			}
		})
	}
}

// Prepare checks every name before it does anything: an invalid or
// unknown SKU is an error naming it, and nothing is written.
func TestPrepareBadInput(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	c := newCoordinators(t, etcd, 1)[0]
	mustCreate(t, c, "known", coordinator.SKUConfig{Total: 10, Segments: 2, InitialFill: 10})
	for _, tc := range []struct {
		name  string
		skus  []string
		is    error
		names string
	}{
		{name: "empty name", skus: []string{"known", ""}, is: coordinator.ErrInvalidArgument, names: "sku"},
		{name: "bad byte", skus: []string{"known", "a b"}, is: coordinator.ErrInvalidArgument, names: `"a b"`},
		{name: "unknown", skus: []string{"known", "nope", "gone"}, is: coordinator.ErrUnknownSKU, names: "nope, gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := currentRev(t, etcd)
			p, err := c.Prepare(t.Context(), tc.skus...)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("Prepare(%q) = %+v, %v; want %v naming %s", tc.skus, p, err, tc.is, tc.names)
			}
			if after := currentRev(t, etcd); after != before {
				t.Fatalf("a refused Prepare moved the revision from %d to %d", before, after)
			}
		})
	}
}

// Prepare leaves alone what it may not take: a SKU whose only segment
// another process holds the lock of (its order's step runs), and one that
// another process sells lazily. Both are skipped, and this process's
// orders of them still sell, by the usual path.
func TestPrepareSkipsLockedAndOwned(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	cs := newCoordinators(t, etcd, 2)
	a, b := cs[0], cs[1]
	ctx := t.Context()
	one := coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}
	mustCreate(t, a, "locked", one)
	mustCreate(t, a, "owned", one)
	mustCreate(t, a, "free", one)
	// B owns "owned" lazily (its first plain order took it over).
	if _, err := b.Allocate(ctx, "owned", "b1", 1, ""); err != nil {
		t.Fatal(err)
	}
	// B holds "locked"'s lock while its step waits.
	inStep, release := make(chan struct{}), make(chan struct{})
	stepDone := make(chan error, 1)
	go func() {
		_, err := b.AllocateFunc(ctx, "locked", "b2", 1, "", func(context.Context) error {
			close(inStep)
			<-release
			return nil
		})
		stepDone <- err
	}()
	select {
	case <-inStep:
	case <-time.After(30 * time.Second):
		t.Fatal("B's step did not start")
	}
	p, err := a.Prepare(ctx, "locked", "owned", "free")
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if p.Ready != 1 || p.Owned != 1 || p.Skipped != 2 {
		t.Fatalf("Prepare = %+v, want 1 ready and owned (free), 2 skipped", *p)
	}
	if err := <-stepDone; err != nil {
		t.Fatal(err)
	}
	for _, sku := range []string{"locked", "owned", "free"} {
		if _, err := a.Allocate(ctx, sku, "a1", 1, ""); err != nil {
			t.Fatalf("%s: %v", sku, err)
		}
		if rep := mustAudit(t, a, sku); !rep.OK {
			t.Fatalf("%s: %+v", sku, rep)
		}
	}
}

// A prepared process that dies mid-sale leaves every SKU's home segment
// of it owned lazily, by nobody alive: the others sell on and take them
// over when their own run dry. Three processes prepare 20 SKUs of 60
// units (4 segments each: every process owns a different one of each) and
// sell; one's etcd client is closed under it (no Close, nothing settled)
// once 300 units are sold. The two others sell until every SKU refuses.
// Every SKU then sold exactly its 60 units (records counted by Audit,
// whatever the dead one's last commits came to), its books balance, every
// order acknowledged is recorded, and the last refusals saw 0 left.
func TestPreparedProcessKilledMidSale(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	victimClient := etcd.Client(t)
	victim, err := coordinator.New(victimClient, coordinator.WithSessionTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Close() })
	cs := append([]*coordinator.Coordinator{victim}, newCoordinators(t, etcd, 2, coordinator.WithSessionTTL(2*time.Second))...)
	ctx := t.Context()
	const skus, total = 20, 60
	var names []string
	for i := range skus {
		names = append(names, fmt.Sprint("k", i))
		mustCreate(t, cs[1], names[i], coordinator.SKUConfig{Total: total, Segments: 4, InitialFill: total, LowWatermark: 1})
	}
	for i, c := range cs {
		p, err := c.Prepare(ctx, names...)
		if err != nil {
			t.Fatal(err)
		}
		if p.Ready != skus || p.Owned != skus {
			t.Fatalf("process %d: Prepare = %+v, want every SKU ready and owned", i, *p)
		}
	}

	var (
		sold      atomic.Int64
		killed    atomic.Bool
		acked     sync.Map // order ID → SKU, every order answered served
		lastEmpty sync.Map // SKU → true once a survivor was refused with 0 left
		wg        sync.WaitGroup
	)
	for p, c := range cs {
		for b := range 5 {
			wg.Go(func() {
				for n := 0; n < 2000; n++ {
					if p == 0 && killed.Load() {
						return
					}
					done := 0
					lastEmpty.Range(func(any, any) bool { done++; return true })
					if done == skus {
						return
					}
					sku := names[(n*7+b*3+p)%skus]
					order := fmt.Sprintf("p%d-b%d-%d", p, b, n)
					actx, cancel := context.WithTimeout(ctx, 10*time.Second)
					_, err := c.Allocate(actx, sku, order, 1, "")
					cancel()
					var refused *coordinator.InsufficientStockError
					switch {
					case err == nil:
						acked.Store(sku+"/"+order, true)
						if sold.Add(1) == 300 {
							killed.Store(true)
							victimClient.Close() // dies: no Close, nothing settled
						}
					case p == 0 && killed.Load():
						return // its own death
					case errors.As(err, &refused):
						if refused.Remaining != 0 {
							t.Errorf("%s refused with %d left", sku, refused.Remaining)
						}
						if p != 0 {
							lastEmpty.Store(sku, true)
						}
					default:
						t.Errorf("process %d order %s: %v", p, order, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if !killed.Load() {
		t.Fatal("the sale ended before the victim was killed")
	}
	survivor := cs[1]
	for _, sku := range names {
		rep := mustAudit(t, survivor, sku)
		if !rep.OK || rep.Allocated != total {
			t.Fatalf("%s: audit %+v; want the books balanced and all %d units allocated", sku, rep, total)
		}
	}
	acked.Range(func(k, _ any) bool {
		sku, order, _ := strings.Cut(k.(string), "/")
		resp, err := etcd.Client(t).Get(ctx, engines.Of(survivor).Keys.Order(sku, order), clientv3.WithCountOnly())
		if err != nil || resp.Count != 1 {
			t.Errorf("acknowledged order %s of %s: %d records, %v", order, sku, resp.Count, err)
		}
		return true
	})
}
