package feed_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// step is one order operation of a scripted history, and the event it must
// make.
type step struct {
	sku, order string
	kind       feed.Kind
	do         func(ctx context.Context, c *coordinator.Coordinator) (int64, error)
}

// script makes every kind of transition on two SKUs, one call at a time,
// and returns the events the feed must deliver for them (revision, kind,
// SKU, order), from what each call returned.
func script(t *testing.T, c *coordinator.Coordinator) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	createSKU(t, c, "tee", 100, 2)
	createSKU(t, c, "mug", 100, 1)
	alloc := func(sku, order string, qty int64) step {
		return step{sku, order, feed.Allocated, func(ctx context.Context, c *coordinator.Coordinator) (int64, error) {
			a, err := c.Allocate(ctx, sku, order, qty, order)
			if err != nil {
				return 0, err
			}
			return a.Revision, nil
		}}
	}
	reserve := func(sku, order string) step {
		return step{sku, order, feed.Reserved, func(ctx context.Context, c *coordinator.Coordinator) (int64, error) {
			a, err := c.Reserve(ctx, sku, order, 1, order, time.Hour, coordinator.WithBuyer("amy"))
			if err != nil {
				return 0, err
			}
			return a.Revision, nil
		}}
	}
	confirm := func(sku, order string) step {
		return step{sku, order, feed.Confirmed, func(ctx context.Context, c *coordinator.Coordinator) (int64, error) {
			r, err := c.Confirm(ctx, sku, order)
			if err != nil {
				return 0, err
			}
			return r.Revision, nil
		}}
	}
	back := func(kind feed.Kind, sku, order string, cancel bool) step {
		return step{sku, order, kind, func(ctx context.Context, c *coordinator.Coordinator) (int64, error) {
			f := c.Release
			if cancel {
				f = c.Cancel
			}
			r, err := f(ctx, sku, order)
			if err != nil {
				return 0, err
			}
			return r.Revision, nil
		}}
	}
	// A reservation of 1 ms, then a Confirm once its deadline has passed:
	// the late Confirm expires it itself (no rebalancer runs here) and says
	// at which revision.
	var deadline time.Time
	reserveShort := func(sku, order string) step {
		return step{sku, order, feed.Reserved, func(ctx context.Context, c *coordinator.Coordinator) (int64, error) {
			a, err := c.Reserve(ctx, sku, order, 1, order, time.Millisecond, coordinator.WithBuyer("amy"))
			if err != nil {
				return 0, err
			}
			deadline = a.Deadline
			return a.Revision, nil
		}}
	}
	confirmLate := func(sku, order string) step {
		return step{sku, order, feed.Expired, func(ctx context.Context, c *coordinator.Coordinator) (int64, error) {
			time.Sleep(time.Until(deadline) + time.Millisecond)
			_, err := c.Confirm(ctx, sku, order)
			var x *coordinator.ExpiredError
			if !errors.As(err, &x) {
				return 0, fmt.Errorf("confirm after the deadline: %v, want an *ExpiredError", err)
			}
			return x.Revision, nil
		}}
	}
	steps := []step{
		alloc("tee", "a-1", 2),
		alloc("mug", "m-1", 1),
		reserve("tee", "r-1"),
		confirm("tee", "r-1"),
		back(feed.Released, "tee", "r-1", false), // a paid order returned
		reserve("tee", "r-2"),
		back(feed.Cancelled, "tee", "r-2", true),
		reserve("tee", "r-3"),
		back(feed.Cancelled, "tee", "r-3", false), // Release of a live reservation is a cancel
		reserveShort("mug", "r-4"),
		confirmLate("mug", "r-4"),
		back(feed.Released, "tee", "a-1", false),
		alloc("tee", "a-2", 3),
	}
	var want []string
	for _, s := range steps {
		rev, err := s.do(ctx, c)
		if err != nil {
			t.Fatalf("%s %s/%s: %v", s.kind, s.sku, s.order, err)
		}
		want = append(want, fmt.Sprintf("%d %s %s/%s", rev, s.kind, s.sku, s.order))
	}
	return want
}

func short(evs []feed.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprintf("%d %s %s/%s", e.Revision, e.Kind, e.SKU, e.Order)
	}
	return out
}

// Every kind of transition, named as the calls that made it say, at the
// revision they returned; the same as an independent reading of each
// record's versions; and a SKU's feed is the all-SKU feed's part of it.
func TestEventKinds(t *testing.T) {
	t.Parallel()
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := e.Client(t)
	c := newCoordinator(t, client, "/kinds/")
	want := script(t, c)

	all := openDrain(t, client, feed.Config{Prefix: "/kinds/", UntilOpen: true})
	sameLines(t, "all SKUs vs the calls", short(all), want)
	hist, _ := history(t, client, "/kinds/", "")
	sameLines(t, "all SKUs vs the records' versions", lines(all), lines(hist))

	mug := openDrain(t, client, feed.Config{Prefix: "/kinds/", SKU: "mug", UntilOpen: true})
	var wantMug []string
	for _, ev := range all {
		if ev.SKU == "mug" {
			wantMug = append(wantMug, line(ev))
		}
	}
	sameLines(t, "mug", lines(mug), wantMug)
	for _, ev := range all {
		if ev.Order == "r-4" && (ev.Buyer != "amy" || !ev.Reservation || ev.Deadline.IsZero() || ev.Qty != 1 || len(ev.Parts) != 1) {
			t.Errorf("r-4's event lacks the order's fields: %+v", ev)
		}
	}
}

// Resuming from every kind of cursor: the start, every revision in the
// middle (with events and without), the latest, one in the future, and
// one older than a compaction.
func TestResumeFromEveryCursor(t *testing.T) {
	t.Parallel()
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := e.Client(t)
	c := newCoordinator(t, client, "/resume/")
	script(t, c)
	hist, latest := history(t, client, "/resume/", "")
	full := lines(hist)

	for cursor := int64(0); cursor <= latest; cursor++ {
		got := openDrain(t, client, feed.Config{Prefix: "/resume/", Since: cursor, UntilOpen: true})
		sameLines(t, fmt.Sprintf("since %d", cursor), lines(got), lines(after(hist, cursor)))
	}
	// A chain of resumes, one batch each, is the whole history once.
	var chained []feed.Event
	for cursor := int64(0); ; {
		f, err := feed.Open(t.Context(), client, feed.Config{Prefix: "/resume/", Since: cursor, Until: latest})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), hang)
		b, err := f.Next(ctx)
		cancel()
		f.Close()
		if err != nil {
			break // io.EOF: checked by the comparison below
		}
		checkBatch(t, b, chained)
		chained, cursor = append(chained, b.Events...), b.Cursor
	}
	sameLines(t, "chained resumes", lines(chained), full)

	t.Run("future", func(t *testing.T) {
		_, err := feed.Open(t.Context(), client, feed.Config{Prefix: "/resume/", Since: latest + 1000})
		var ahead *feed.AheadError
		if !errors.As(err, &ahead) || !errors.Is(err, feed.ErrCursorAhead) || ahead.Cursor != latest+1000 || ahead.Current < latest {
			t.Fatalf("open ahead: %v, want an *AheadError", err)
		}
	})
	t.Run("latest, then live", func(t *testing.T) {
		f, err := feed.Open(t.Context(), client, feed.Config{Prefix: "/resume/", Since: latest})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		a, err := c.Allocate(t.Context(), "mug", "live-1", 1, "x")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), hang)
		defer cancel()
		b, err := f.Next(ctx)
		if err != nil || len(b.Events) != 1 || b.Events[0].Order != "live-1" || b.Events[0].Revision != a.Revision || b.Cursor != a.Revision {
			t.Fatalf("live event: %+v, %v; want live-1 at %d", b, err, a.Revision)
		}
	})
	t.Run("compacted", func(t *testing.T) {
		// Compact at the revision of the 5th event: a cursor before the one
		// just below it is gone; from just below it everything is there.
		compactAt := hist[4].Revision
		if _, err := client.Compact(t.Context(), compactAt, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
		for _, cursor := range []int64{0, 1, compactAt - 2} {
			f, err := feed.Open(t.Context(), client, feed.Config{Prefix: "/resume/", Since: cursor, UntilOpen: true})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), hang)
			_, err = f.Next(ctx)
			cancel()
			f.Close()
			var ce *feed.CompactedError
			if !errors.As(err, &ce) || !errors.Is(err, feed.ErrCompacted) || ce.Cursor != cursor || ce.CompactRevision != compactAt {
				t.Fatalf("since %d after a compaction at %d: %v, want a *CompactedError", cursor, compactAt, err)
			}
		}
		got := openDrain(t, client, feed.Config{Prefix: "/resume/", Since: compactAt - 1, Until: latest})
		sameLines(t, "from just below the compaction", lines(got), lines(after(hist, compactAt-1)))
	})
}

// A snapshot is every order's latest event, and a feed from its cursor
// adds exactly what came after.
func TestSnapshotThenFeed(t *testing.T) {
	t.Parallel()
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := e.Client(t)
	c := newCoordinator(t, client, "/snap/")
	script(t, c)
	snap, err := feed.Snapshot(t.Context(), client, feed.Config{Prefix: "/snap/", SKU: "tee"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Confirm(t.Context(), "tee", "r-1"); err == nil {
		t.Fatal("confirm of a released order succeeded")
	}
	a, err := c.Allocate(t.Context(), "tee", "after-1", 1, "x")
	if err != nil {
		t.Fatal(err)
	}
	rest := openDrain(t, client, feed.Config{Prefix: "/snap/", SKU: "tee", Since: snap.Cursor, UntilOpen: true})
	if len(rest) != 1 || rest[0].Order != "after-1" || rest[0].Revision != a.Revision {
		t.Fatalf("after the snapshot: %v, want after-1 only", short(rest))
	}
	hist, _ := history(t, client, "/snap/", "tee")
	latest := map[string]feed.Event{}
	for _, ev := range hist {
		if ev.Revision <= snap.Cursor {
			latest[ev.Order] = ev
		}
	}
	if len(snap.Events) != len(latest) {
		t.Fatalf("snapshot has %d orders, want %d", len(snap.Events), len(latest))
	}
	for i, ev := range snap.Events {
		if line(ev) != line(latest[ev.Order]) {
			t.Errorf("snapshot %s, want %s", line(ev), line(latest[ev.Order]))
		}
		if i > 0 && snap.Events[i-1].Revision > ev.Revision {
			t.Errorf("snapshot not in revision order at %d", i)
		}
	}
}

// Bad input is refused with errors that say what, before anything runs.
func TestOpenRefuses(t *testing.T) {
	t.Parallel()
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := e.Client(t)
	c := newCoordinator(t, client, "/refuse/")
	createSKU(t, c, "tee", 10, 1)
	for _, tc := range []struct {
		name string
		cfg  feed.Config
		want error
	}{
		{"unknown SKU", feed.Config{Prefix: "/refuse/", SKU: "nope"}, feed.ErrUnknownSKU},
		{"invalid SKU", feed.Config{Prefix: "/refuse/", SKU: "a/b"}, feed.ErrInvalidArgument},
		{"negative since", feed.Config{Prefix: "/refuse/", Since: -1}, feed.ErrInvalidArgument},
		{"until before since", feed.Config{Prefix: "/refuse/", Since: 5, Until: 4}, feed.ErrInvalidArgument},
		{"until and UntilOpen", feed.Config{Prefix: "/refuse/", Until: 4, UntilOpen: true}, feed.ErrInvalidArgument},
		{"until ahead", feed.Config{Prefix: "/refuse/", Until: 1 << 40}, feed.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := feed.Open(t.Context(), client, tc.cfg)
			if !errors.Is(err, tc.want) {
				if f != nil {
					f.Close()
				}
				t.Fatalf("open %+v: %v, want %v", tc.cfg, err, tc.want)
			}
		})
	}
	if _, err := feed.Snapshot(t.Context(), client, feed.Config{Prefix: "/refuse/", SKU: "nope"}); !errors.Is(err, feed.ErrUnknownSKU) {
		t.Fatalf("snapshot of an unknown SKU: %v", err)
	}
}

// Prune replaces archived orders' records by claims of their IDs, and a
// later prune deletes the claims: neither is an order event. A feed open
// across both delivers only the orders placed meanwhile, and a snapshot
// after them lists the orders kept, not the claims.
func TestPruneIsNoEvent(t *testing.T) {
	t.Parallel()
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := e.Client(t)
	c := newCoordinator(t, client, "/prune/")
	createSKU(t, c, "tee", 100, 2)
	ctx := t.Context()
	for i := range 5 {
		if _, err := c.Allocate(ctx, "tee", fmt.Sprintf("old-%d", i), 1, "x"); err != nil {
			t.Fatal(err)
		}
	}
	cutoff := time.Now()
	snap, err := feed.Snapshot(ctx, client, feed.Config{Prefix: "/prune/", SKU: "tee"})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := c.Prune(ctx, "tee", cutoff); err != nil || p.Orders != 5 {
		t.Fatalf("prune: %+v, %v", p, err)
	}
	a, err := c.Allocate(ctx, "tee", "new-1", 1, "x")
	if err != nil {
		t.Fatal(err)
	}
	mid, err := feed.Snapshot(ctx, client, feed.Config{Prefix: "/prune/", SKU: "tee"})
	if err != nil {
		t.Fatal(err)
	}
	if len(mid.Events) != 1 || mid.Events[0].Order != "new-1" {
		t.Fatalf("snapshot beside 5 claims: %v, want new-1 only", short(mid.Events))
	}
	if p, err := c.Prune(ctx, "tee", cutoff, coordinator.KeepPrunedIDs(0)); err != nil || p.Forgotten != 5 {
		t.Fatalf("prune forgetting the claims: %+v, %v", p, err)
	}
	b, err := c.Allocate(ctx, "tee", "new-2", 1, "x")
	if err != nil {
		t.Fatal(err)
	}
	rest := openDrain(t, client, feed.Config{Prefix: "/prune/", SKU: "tee", Since: snap.Cursor, UntilOpen: true})
	if len(rest) != 2 || rest[0].Order != "new-1" || rest[0].Revision != a.Revision || rest[1].Order != "new-2" || rest[1].Revision != b.Revision {
		t.Fatalf("the feed across two prunes: %v, want new-1 and new-2 only", short(rest))
	}
	after, err := feed.Snapshot(ctx, client, feed.Config{Prefix: "/prune/", SKU: "tee"})
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Events) != 2 || after.Events[0].Order != "new-1" || after.Events[1].Order != "new-2" {
		t.Fatalf("snapshot after the prunes: %v, want new-1 and new-2", short(after.Events))
	}
}
