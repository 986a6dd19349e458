package service_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/service"
)

// ordersStream is a WatchOrders stream and what it has delivered.
type ordersStream struct {
	s       *connect.ServerStreamForClient[stockctlv1.WatchOrdersResponse]
	batches []*stockctlv1.WatchOrdersResponse
	events  []*stockctlv1.OrderEvent
}

func watchOrders(t *testing.T, c stockctlv1connect.StockServiceClient, ctx context.Context, req *stockctlv1.WatchOrdersRequest) *ordersStream {
	t.Helper()
	s, err := c.WatchOrders(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("WatchOrders(%v): %v", req, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &ordersStream{s: s}
}

// until receives batches until the stream has delivered n events in all,
// checking each batch as it comes: feed order, cursors that grow and cover
// their events, nothing at or before the previous cursor.
func (o *ordersStream) until(t *testing.T, n int, prevCursor int64) {
	t.Helper()
	for len(o.events) < n {
		if !o.s.Receive() {
			t.Fatalf("stream ended after %d of %d events: %v", len(o.events), n, o.s.Err())
		}
		b := o.s.Msg()
		if !b.Snapshot {
			if b.Cursor <= prevCursor {
				t.Fatalf("batch cursor %d after cursor %d: want it to grow", b.Cursor, prevCursor)
			}
			for _, ev := range b.Events {
				if ev.Revision <= prevCursor || ev.Revision > b.Cursor {
					t.Fatalf("event %v in a batch after cursor %d with cursor %d", ev, prevCursor, b.Cursor)
				}
			}
			prevCursor = b.Cursor
		}
		o.batches = append(o.batches, b)
		o.events = append(o.events, b.Events...)
	}
	for i := 1; i < len(o.events); i++ {
		if eventOrder(o.events[i-1], o.events[i]) >= 0 {
			t.Fatalf("event %d %v after %v: want revision, then SKU, then order ID order, and no duplicate", i, o.events[i], o.events[i-1])
		}
	}
}

func eventOrder(a, b *stockctlv1.OrderEvent) int {
	return cmp.Or(cmp.Compare(a.Revision, b.Revision), cmp.Compare(a.Sku, b.Sku), cmp.Compare(a.Order, b.Order))
}

// catchUp reads, with package feed directly on etcd, every event of sku
// ("" every SKU) after since up to etcd's current revision: what the
// stream must deliver, no more and no less.
func catchUp(t *testing.T, e *env, sku string, since int64) []feed.Event {
	t.Helper()
	f, err := feed.Open(ctx(t), e.coord.Client(), feed.Config{Prefix: e.coord.Prefix(), SKU: sku, Since: since, UntilOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []feed.Event
	for {
		b, err := f.Next(ctx(t))
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b.Events...)
	}
}

// sameEvents fails t unless the stream's events are the feed's, field by
// field.
func sameEvents(t *testing.T, what string, got []*stockctlv1.OrderEvent, want []feed.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d", what, len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		kind := strings.ToLower(strings.TrimPrefix(g.Event.String(), "ORDER_EVENT_KIND_"))
		if g.Revision != w.Revision || kind != string(w.Kind) || g.Sku != w.SKU || g.Order != w.Order || g.Qty != w.Qty ||
			g.Buyer != w.Buyer || g.Reservation != w.Reservation || g.Version != w.Version || len(g.Parts) != len(w.Parts) ||
			!g.CreateTime.AsTime().Equal(w.Created) || (g.Deadline != nil) != !w.Deadline.IsZero() {
			t.Fatalf("%s: event %d is %v, want %+v", what, i, g, w)
		}
		if g.Deadline != nil && !g.Deadline.AsTime().Equal(w.Deadline) {
			t.Fatalf("%s: event %d deadline %v, want %v", what, i, g.Deadline.AsTime(), w.Deadline)
		}
		for j, p := range w.Parts {
			if g.Parts[j].Place != p.Place.String() || g.Parts[j].Qty != p.Qty {
				t.Fatalf("%s: event %d parts %v, want %v", what, i, g.Parts, w.Parts)
			}
		}
	}
}

// The stream of every SKU's orders, while orders are placed, reserved,
// confirmed and released concurrently on two SKUs, delivers exactly the
// events etcd has, in feed order, each once; a stream resumed from any
// batch's cursor delivers exactly the events after it.
func TestWatchOrdersConcurrent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	skus := []string{"wo-a", "wo-b"}
	for _, sku := range skus {
		createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: sku, Total: 1000, Segments: 4, InitialFill: 400})
	}
	// The history before the stream starts comes first, from since 0.
	if _, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "wo-a", Order: "early", Qty: 3, Buyer: "ann"})); err != nil {
		t.Fatal(err)
	}
	all := watchOrders(t, c, ctx(t), &stockctlv1.WatchOrdersRequest{})
	one := watchOrders(t, e.stock(t, connectJSON), ctx(t), &stockctlv1.WatchOrdersRequest{Sku: "wo-b"})

	const writers, perWriter = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				sku, order := skus[(w+i)%2], fmt.Sprintf("w%d-%d", w, i)
				var err error
				if i%2 == 0 {
					_, err = c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: sku, Order: order, Qty: int64(1 + i%3), RouteKey: order}))
				} else {
					_, err = c.Reserve(ctx(t), connect.NewRequest(&stockctlv1.ReserveRequest{Sku: sku, Order: order, Qty: 1, Buyer: "b" + order, Ttl: durationpb.New(time.Hour)}))
					if err == nil && i%4 == 1 {
						_, err = c.Confirm(ctx(t), connect.NewRequest(&stockctlv1.ConfirmRequest{Sku: sku, Order: order}))
					}
				}
				if err == nil && i%3 == 0 {
					_, err = c.Release(ctx(t), connect.NewRequest(&stockctlv1.ReleaseRequest{Sku: sku, Order: order}))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	want := catchUp(t, e, "", 0)
	// 1 early + 40 placed + 10 confirmed (i = 1, 5, 9) + 12 released (i = 0, 3, 6, 9).
	if len(want) != 1+writers*perWriter+writers*3+writers*4 {
		t.Fatalf("the feed has %d events, want %d", len(want), 1+writers*perWriter+writers*3+writers*4)
	}
	all.until(t, len(want), 0)
	sameEvents(t, "every SKU from 0", all.events, want)

	wantB := catchUp(t, e, "wo-b", 0)
	one.until(t, len(wantB), 0)
	sameEvents(t, "wo-b over Connect JSON", one.events, wantB)

	// Resume from each batch's cursor: exactly the events after it.
	seen := 0
	for i, b := range all.batches[:len(all.batches)-1] {
		seen += len(b.Events)
		if i%3 != 0 {
			continue // a few resumes are enough
		}
		rctx, cancel := context.WithCancel(ctx(t))
		r := watchOrders(t, c, rctx, &stockctlv1.WatchOrdersRequest{Since: b.Cursor})
		r.until(t, len(want)-seen, b.Cursor)
		sameEvents(t, fmt.Sprintf("resumed from cursor %d", b.Cursor), r.events, want[seen:])
		cancel()
	}

	// The streams end when their callers do: no long call is left.
	for _, s := range []*ordersStream{all, one} {
		_ = s.s.Close()
	}
	waitFor(t, "the streams to end", func() bool { return gauge(t, e, "stockctl_api_inflight_calls", "kind", "long") == 0 })
	if n := counter(t, e, "stockctl_api_request_duration_seconds", "method", "stockctl.v1.StockService/WatchOrders"); n < 2 {
		t.Errorf("%v WatchOrders calls counted, want every stream", n)
	}
}

// gauge is the value of the series of a gauge family with one label set to
// value (-1 if there is none).
func gauge(t *testing.T, e *env, family, label, value string) float64 {
	t.Helper()
	fams, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != family {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// A snapshot start sends every order in its latest state, marked snapshot,
// with the snapshot's revision as the cursor, then the events after it.
func TestWatchOrdersSnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "snap", Total: 100, Segments: 2, InitialFill: 100})
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "other", Total: 100, Segments: 1, InitialFill: 100})
	step := func(f func(context.Context) error) {
		t.Helper()
		if err := f(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	step(func(x context.Context) error {
		_, err := c.Allocate(x, connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "snap", Order: "s-1", Qty: 2}))
		return err
	})
	step(func(x context.Context) error {
		_, err := c.Reserve(x, connect.NewRequest(&stockctlv1.ReserveRequest{Sku: "snap", Order: "s-2", Qty: 1, Buyer: "bo", Ttl: durationpb.New(time.Hour)}))
		return err
	})
	step(func(x context.Context) error {
		_, err := c.Confirm(x, connect.NewRequest(&stockctlv1.ConfirmRequest{Sku: "snap", Order: "s-2"}))
		return err
	})
	step(func(x context.Context) error {
		_, err := c.Release(x, connect.NewRequest(&stockctlv1.ReleaseRequest{Sku: "snap", Order: "s-1"}))
		return err
	})
	step(func(x context.Context) error {
		_, err := c.Allocate(x, connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "other", Order: "o-1", Qty: 1}))
		return err
	})
	history := catchUp(t, e, "snap", 0)
	if len(history) != 4 {
		t.Fatalf("history %v, want 4 events", history)
	}

	s := watchOrders(t, c, ctx(t), &stockctlv1.WatchOrdersRequest{Sku: "snap", Snapshot: true})
	if !s.s.Receive() {
		t.Fatalf("no snapshot: %v", s.s.Err())
	}
	snap := s.s.Msg()
	s.batches, s.events = append(s.batches, snap), append(s.events, snap.Events...)
	byOrder := map[string]*stockctlv1.OrderEvent{}
	for _, ev := range snap.Events {
		byOrder[ev.Order] = ev
	}
	if !snap.Snapshot || len(snap.Events) != 2 || snap.Cursor < history[3].Revision ||
		byOrder["s-1"].GetEvent() != stockctlv1.OrderEventKind_ORDER_EVENT_KIND_RELEASED || byOrder["s-1"].Revision != history[3].Revision ||
		byOrder["s-2"].GetEvent() != stockctlv1.OrderEventKind_ORDER_EVENT_KIND_CONFIRMED || byOrder["s-2"].Revision != history[2].Revision ||
		byOrder["s-2"].Buyer != "bo" || !byOrder["s-2"].Reservation || byOrder["s-2"].Deadline == nil {
		t.Fatalf("snapshot %v, want s-1 released and s-2 confirmed at their revisions, cursor at least %d", snap, history[3].Revision)
	}
	step(func(x context.Context) error {
		_, err := c.Release(x, connect.NewRequest(&stockctlv1.ReleaseRequest{Sku: "snap", Order: "s-2"}))
		return err
	})
	s.until(t, 3, snap.Cursor)
	if b := s.batches[len(s.batches)-1]; b.Snapshot || s.events[2].Order != "s-2" || s.events[2].Event != stockctlv1.OrderEventKind_ORDER_EVENT_KIND_RELEASED {
		t.Fatalf("after the snapshot: %v, want s-2 released", s.batches[1:])
	}

	// A SKU without orders: one empty snapshot message with a cursor.
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "empty", Total: 1, Segments: 1})
	s = watchOrders(t, c, ctx(t), &stockctlv1.WatchOrdersRequest{Sku: "empty", Snapshot: true})
	if !s.s.Receive() {
		t.Fatalf("no snapshot: %v", s.s.Err())
	}
	if m := s.s.Msg(); !m.Snapshot || len(m.Events) != 0 || m.Cursor <= snap.Cursor {
		t.Fatalf("snapshot of a SKU without orders: %v, want no events and a cursor past %d", m, snap.Cursor)
	}
}

// receiveError is the error a stream ends with before its first message.
func receiveError(t *testing.T, c stockctlv1connect.StockServiceClient, req *stockctlv1.WatchOrdersRequest) error {
	t.Helper()
	s, err := c.WatchOrders(ctx(t), connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer s.Close()
	if s.Receive() {
		t.Fatalf("WatchOrders(%v): a message %v, want an error", req, s.Msg())
	}
	if s.Err() == nil {
		t.Fatalf("WatchOrders(%v): the stream ended without an error", req)
	}
	return s.Err()
}

// A cursor older than etcd's compaction is FAILED_PRECONDITION
// (CURSOR_COMPACTED) with the compact revision; one at the compaction
// still streams.
func TestWatchOrdersCompacted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "cmp", Total: 100, Segments: 1, InitialFill: 100})
	for i := range 4 {
		if _, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "cmp", Order: fmt.Sprintf("c-%d", i), Qty: 1})); err != nil {
			t.Fatal(err)
		}
	}
	history := catchUp(t, e, "cmp", 0)
	compactAt := history[2].Revision
	if _, err := e.coord.Client().Compact(ctx(t), compactAt, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	since := history[0].Revision
	err := receiveError(t, c, &stockctlv1.WatchOrdersRequest{Sku: "cmp", Since: since})
	wantError(t, "a compacted cursor", err, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_CURSOR_COMPACTED)
	if d := detail[*stockctlv1.CursorCompacted](t, err); d.Cursor != since || d.CompactRevision != compactAt {
		t.Fatalf("CursorCompacted %v, want cursor %d, compact revision %d", d, since, compactAt)
	}
	if info := detail[*errdetails.ErrorInfo](t, err); info.Metadata["compact_revision"] != fmt.Sprint(compactAt) {
		t.Fatalf("ErrorInfo metadata %v, want compact_revision %d", info.Metadata, compactAt)
	}
	// From compactAt-1 the events after it are still there.
	s := watchOrders(t, c, ctx(t), &stockctlv1.WatchOrdersRequest{Sku: "cmp", Since: compactAt - 1})
	s.until(t, 2, compactAt-1)
	sameEvents(t, "from the compaction", s.events, history[2:])
}

// Bad input is refused before anything is streamed, says what was wrong,
// and changes nothing in etcd; without the token the stream is refused.
func TestWatchOrdersBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withToken())
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "bad", Total: 10, Segments: 1, InitialFill: 10})
	revision := func() int64 {
		resp, err := e.coord.Client().Get(ctx(t), "health-probe-nothing")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	before := revision()
	for _, tc := range []struct {
		name   string
		req    *stockctlv1.WatchOrdersRequest
		code   connect.Code
		reason stockctlv1.ErrorReason
		says   string
		field  string // the BadRequest's field, for INVALID_ARGUMENT
	}{
		{"negative since", &stockctlv1.WatchOrdersRequest{Sku: "bad", Since: -1}, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, "invalid since: must be a revision from 0", "since"},
		{"snapshot and since", &stockctlv1.WatchOrdersRequest{Sku: "bad", Since: 2, Snapshot: true}, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, "must be 0 with snapshot", "since"},
		{"unknown SKU", &stockctlv1.WatchOrdersRequest{Sku: "nope"}, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_SKU_NOT_FOUND, `"nope"`, ""},
		{"unknown SKU, snapshot", &stockctlv1.WatchOrdersRequest{Sku: "nope", Snapshot: true}, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_SKU_NOT_FOUND, `"nope"`, ""},
		{"malformed SKU", &stockctlv1.WatchOrdersRequest{Sku: "no such/sku"}, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, "no such/sku", "sku"},
		{"cursor ahead", &stockctlv1.WatchOrdersRequest{Sku: "bad", Since: before + 1000}, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_CURSOR_AHEAD, fmt.Sprintf("cursor %d, etcd is at revision %d", before+1000, before), "since"},
	} {
		err := receiveError(t, c, tc.req)
		wantError(t, tc.name, err, tc.code, tc.reason)
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want it to say %q", tc.name, err, tc.says)
		}
		if tc.field != "" {
			if v := detail[*errdetails.BadRequest](t, err).FieldViolations; len(v) != 1 || v[0].Field != tc.field {
				t.Errorf("%s: field violations %v, want one of %s", tc.name, v, tc.field)
			}
		}
		if tc.reason == stockctlv1.ErrorReason_ERROR_REASON_CURSOR_AHEAD {
			if d := detail[*stockctlv1.CursorAhead](t, err); d.Cursor != before+1000 || d.Revision != before {
				t.Errorf("CursorAhead %v, want cursor %d at revision %d", d, before+1000, before)
			}
		}
	}
	if after := revision(); after != before {
		t.Fatalf("etcd moved from revision %d to %d under refused calls", before, after)
	}
	noToken := stockctlv1connect.NewStockServiceClient(httpClient(t, true, ""), e.url, connect.WithGRPC())
	wantError(t, "without a token", receiveError(t, noToken, &stockctlv1.WatchOrdersRequest{Sku: "bad"}),
		connect.CodeUnauthenticated, stockctlv1.ErrorReason_ERROR_REASON_TOKEN_MISSING)
}

// A snapshot larger than a page comes in pages marked snapshot, every
// order once, the cursor on the last page only; then the live events.
func TestWatchOrdersSnapshotPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	const orders = service.SnapshotPageEvents + 1
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "pages", Total: orders + 1, Segments: 8, InitialFill: orders + 1})
	errs := make(chan error, orders)
	parallel(32, func(w int) {
		for i := w; i < orders; i += 32 {
			if _, err := e.coord.Allocate(ctx(t), "pages", fmt.Sprintf("p-%04d", i), 1, ""); err != nil {
				errs <- err
			}
		}
	})
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := watchOrders(t, c, ctx(t), &stockctlv1.WatchOrdersRequest{Sku: "pages", Snapshot: true})
	seen := map[string]bool{}
	var cursor int64
	for pages := 0; cursor == 0; pages++ {
		if !s.s.Receive() {
			t.Fatalf("snapshot ended after %d pages: %v", pages, s.s.Err())
		}
		m := s.s.Msg()
		if !m.Snapshot || len(m.Events) == 0 || len(m.Events) > service.SnapshotPageEvents {
			t.Fatalf("snapshot page %d: snapshot %v, %d events, want 1 to %d", pages, m.Snapshot, len(m.Events), service.SnapshotPageEvents)
		}
		for _, ev := range m.Events {
			if seen[ev.Order] || ev.Event != stockctlv1.OrderEventKind_ORDER_EVENT_KIND_ALLOCATED {
				t.Fatalf("snapshot page %d: %v (seen before: %v)", pages, ev, seen[ev.Order])
			}
			seen[ev.Order] = true
			if ev.Revision > m.Cursor && m.Cursor != 0 {
				t.Fatalf("snapshot event %v after the snapshot's cursor %d", ev, m.Cursor)
			}
		}
		cursor = m.Cursor
		if cursor != 0 && pages != 1 {
			t.Fatalf("the cursor came on page %d, want it on the second and last", pages)
		}
	}
	if len(seen) != orders {
		t.Fatalf("the snapshot has %d orders, want %d", len(seen), orders)
	}
	if _, err := e.coord.Allocate(ctx(t), "pages", "after", 1, ""); err != nil {
		t.Fatal(err)
	}
	s.until(t, 1, cursor)
	if s.events[0].Order != "after" || s.batches[0].Snapshot {
		t.Fatalf("after the snapshot: %v", s.batches[0])
	}
}

// A server that shuts down ends its WatchOrders streams with UNAVAILABLE
// (SHUTTING_DOWN), at once, not at the next event.
func TestWatchOrdersShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "down", Total: 10, Segments: 1, InitialFill: 10})
	if _, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "down", Order: "d-1", Qty: 1})); err != nil {
		t.Fatal(err)
	}
	s := watchOrders(t, c, ctx(t), &stockctlv1.WatchOrdersRequest{Sku: "down"})
	s.until(t, 1, 0)
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if s.s.Receive() {
		t.Fatalf("a batch after shutdown: %v", s.s.Msg())
	}
	wantError(t, "a stream at shutdown", s.s.Err(), connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN)
}
