package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

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
// (the control), so the test fails where Prepare does nothing. The
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
		maxKeys   float64 // keys written per order, at most
		minKeys   float64 // and at least
	}{
		{name: "lazy prepared", prepare: true, wantOwned: skus, minKeys: 1, maxKeys: 1},
		{name: "lazy unprepared", minKeys: 1.9, maxKeys: 2.05}, // 2.05: the seat's claim
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
				// Its takeovers, and the process's seat (one key).
				wrote := keysWritten(t, raw, prefix, before, currentRev(t, etcd))
				if want := int64(tc.wantOwned); wrote < want || wrote > want+1 {
					t.Fatalf("Prepare wrote %d keys; want %d takeovers and a seat", wrote, want)
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
