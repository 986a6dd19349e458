package feed_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// SnapshotPages hands over what Snapshot returns, a page of at most
// SnapshotPage events at a time, each order once, each page in feed order,
// every page with the snapshot's cursor and only the last marked last; a
// page's error ends it with that error. Table: scopes of no order, one
// page exactly, and more than one page.
func TestSnapshotPages(t *testing.T) {
	t.Parallel()
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	client := e.Client(t)
	c := newCoordinator(t, client, "/pages/")
	for _, tc := range []struct {
		sku    string
		orders int
		pages  int
	}{
		{"none", 0, 1},
		{"one-page", feed.SnapshotPage, 1},
		{"three-pages", 2*feed.SnapshotPage + 1, 3},
	} {
		t.Run(tc.sku, func(t *testing.T) {
			createSKU(t, c, tc.sku, int64(tc.orders)+1, 4)
			errs := make(chan error, tc.orders)
			sem := make(chan struct{}, 32)
			for i := range tc.orders {
				sem <- struct{}{}
				go func() {
					defer func() { <-sem }()
					_, err := c.Allocate(t.Context(), tc.sku, fmt.Sprintf("%s-%05d", tc.sku, i), 1, "")
					errs <- err
				}()
			}
			for range tc.orders {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			cfg := feed.Config{Prefix: "/pages/", SKU: tc.sku}
			whole, err := feed.Snapshot(t.Context(), client, cfg)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{}
			for _, ev := range whole.Events {
				want[ev.Order] = line(ev)
			}
			got := map[string]string{}
			pages, lasts := 0, 0
			var cursor int64
			err = feed.SnapshotPages(t.Context(), client, cfg, func(b feed.Batch, last bool) error {
				pages++
				if last {
					lasts++
				}
				if len(b.Events) > feed.SnapshotPage || (cursor != 0 && b.Cursor != cursor) || b.Cursor < whole.Cursor {
					return fmt.Errorf("page %d: %d events, cursor %d (before %d, whole snapshot's %d)", pages, len(b.Events), b.Cursor, cursor, whole.Cursor)
				}
				cursor = b.Cursor
				for i, ev := range b.Events {
					if got[ev.Order] != "" {
						return fmt.Errorf("order %s twice", ev.Order)
					}
					if i > 0 && b.Events[i-1].Revision > ev.Revision {
						return fmt.Errorf("page %d not in revision order at %d", pages, i)
					}
					got[ev.Order] = line(ev)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if pages != tc.pages || lasts != 1 || len(got) != tc.orders {
				t.Fatalf("%d pages (%d last), %d orders; want %d pages, one last, %d orders", pages, lasts, len(got), tc.pages, tc.orders)
			}
			for o, l := range want {
				if got[o] != l {
					t.Fatalf("order %s: %q, want %q (no change between the two reads)", o, got[o], l)
				}
			}
			stop := errors.New("stop")
			n := 0
			if err := feed.SnapshotPages(t.Context(), client, cfg, func(feed.Batch, bool) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
				t.Fatalf("a page's error: %v after %d pages, want it at once", err, n)
			}
		})
	}
}
