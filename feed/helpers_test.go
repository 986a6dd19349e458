package feed_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// hang bounds every wait of these tests: generous, only there so that a
// bug shows as a failure rather than a test binary killed by -timeout.
const hang = 60 * time.Second

func newCoordinator(t testing.TB, client *clientv3.Client, prefix string) *coordinator.Coordinator {
	t.Helper()
	c, err := coordinator.New(client, coordinator.WithPrefix(prefix))
	if err != nil {
		t.Fatalf("coordinator: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func createSKU(t testing.TB, c *coordinator.Coordinator, sku string, total int64, segs int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	if _, err := c.CreateSKU(ctx, sku, coordinator.SKUConfig{Total: total, Segments: segs, InitialFill: total / 2,
		LowWatermark: 2, RefillBatch: 10}); err != nil {
		t.Fatalf("create %s: %v", sku, err)
	}
}

// line is an event as the tests compare them: every field that matters,
// in one comparable string.
func line(e feed.Event) string {
	parts := make([]string, len(e.Parts))
	for i, p := range e.Parts {
		parts[i] = fmt.Sprintf("%v:%d", p.Place, p.Qty)
	}
	dl := ""
	if !e.Deadline.IsZero() {
		dl = e.Deadline.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("%d %s %s/%s qty=%d parts=%s buyer=%s res=%v deadline=%s v=%d",
		e.Revision, e.Kind, e.SKU, e.Order, e.Qty, strings.Join(parts, ","), e.Buyer, e.Reservation, dl, e.Version)
}

func lines(evs []feed.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = line(e)
	}
	return out
}

// drain reads f to its end (a feed with Until or UntilOpen), checking that
// every batch holds whole revisions in feed order and that its Cursor is
// right.
func drain(t testing.TB, f *feed.Feed) []feed.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	var out []feed.Event
	for {
		b, err := f.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("next after %d events: %v", len(out), err)
		}
		checkBatch(t, b, out)
		out = append(out, b.Events...)
	}
}

// checkBatch checks one batch against the events delivered before it.
func checkBatch(t testing.TB, b feed.Batch, before []feed.Event) {
	t.Helper()
	if len(b.Events) == 0 {
		return // the cursor moved past revisions with nothing to deliver
	}
	if last := b.Events[len(b.Events)-1].Revision; b.Cursor < last {
		t.Fatalf("batch cursor %d before its last event's revision %d", b.Cursor, last)
	}
	if len(before) > 0 && b.Events[0].Revision <= before[len(before)-1].Revision {
		t.Fatalf("batch starts at revision %d, not after the last delivered %d: a revision split or repeated",
			b.Events[0].Revision, before[len(before)-1].Revision)
	}
}

// openDrain opens a catch-up feed and reads it to its end.
func openDrain(t testing.TB, client *clientv3.Client, cfg feed.Config) []feed.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	f, err := feed.Open(ctx, client, cfg)
	if err != nil {
		t.Fatalf("open %+v: %v", cfg, err)
	}
	defer f.Close()
	return drain(t, f)
}

// history reads every event of the order records under prefix (of sku, or
// all SKUs when sku is ""), independently of the feed: it walks back each
// record's versions with plain reads at past revisions, and names each
// version's kind from the transitions the coordinator makes. It needs the
// history uncompacted and no deletes.
func history(t testing.TB, client *clientv3.Client, prefix, sku string) (evs []feed.Event, at int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	space, err := keys.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	from := space.Prefix() + "orders/"
	if sku != "" {
		from = space.Orders(sku)
	}
	resp, err := client.Get(ctx, from, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	at = resp.Header.Revision
	for _, kv := range resp.Kvs {
		for kv != nil {
			o, err := segments.DecodeOrder(string(kv.Key), kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			var kind feed.Kind
			switch {
			case o.State == "" && !o.Released:
				kind = feed.Allocated
			case o.State == "":
				kind = feed.Released
			case o.State == segments.StateExpired:
				kind = feed.Expired
			case o.State == segments.StateReserved && o.Released:
				kind = feed.Cancelled
			case o.State == segments.StateReserved:
				kind = feed.Reserved
			case o.State == segments.StateConfirmed && o.Released:
				kind = feed.Released
			default:
				kind = feed.Confirmed
			}
			evs = append(evs, feed.Event{Revision: kv.ModRevision, Kind: kind, SKU: o.SKU, Order: o.ID, Qty: o.Qty,
				Parts: o.Parts, Buyer: o.Buyer, Reservation: o.State != "", Deadline: o.Deadline, Created: o.Created,
				Version: kv.Version})
			if kv.Version == 1 {
				break
			}
			prev, err := client.Get(ctx, string(kv.Key), clientv3.WithRev(kv.ModRevision-1))
			if err != nil {
				t.Fatal(err)
			}
			if len(prev.Kvs) != 1 {
				t.Fatalf("%s has version %d but nothing at revision %d", kv.Key, kv.Version, kv.ModRevision-1)
			}
			kv = prev.Kvs[0]
		}
	}
	slices.SortFunc(evs, func(a, b feed.Event) int {
		if a.Revision != b.Revision {
			return int(a.Revision - b.Revision)
		}
		if a.SKU != b.SKU {
			return strings.Compare(a.SKU, b.SKU)
		}
		return strings.Compare(a.Order, b.Order)
	})
	return evs, at
}

// after is the events of evs with a revision greater than rev.
func after(evs []feed.Event, rev int64) []feed.Event {
	i, _ := slices.BinarySearchFunc(evs, rev+1, func(e feed.Event, r int64) int { return int(e.Revision - r) })
	return evs[i:]
}

// sameLines fails t with the first difference between got and want.
func sameLines(t testing.TB, what string, got, want []string) {
	t.Helper()
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			t.Fatalf("%s: event %d differs:\n got %s\nwant %s", what, i, got[i], want[i])
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d", what, len(got), len(want))
	}
}
