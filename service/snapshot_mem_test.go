package service_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/service"
)

// Issue 28, 5b: 60 WatchOrders streams with snapshot on a SKU of many
// orders, whose callers read the first page and then nothing, took about
// 540 bytes an order a stream (the whole snapshot each). Snapshots are now
// read from etcd page by page as the stream takes them, at most
// SnapshotPagesInFlight pages held over all streams: the heap grows by a
// bounded amount, not by orders × streams, and the streams that wait for
// a page hold none. Then, the others gone, six callers read and each gets
// every order once.
func TestWatchOrdersSnapshotMemoryBounded(t *testing.T) {
	const (
		orders  = 20000
		streams = 60
	)
	// 60 streams of 20,000 orders read side by side take a minute and more
	// on a busy 2-core machine: the streams and their pages get a bound
	// that only catches a hang.
	const streamBound = 5 * time.Minute
	e := newEnv(t, withConfig(func(c *service.Config) { c.SnapshotPageTimeout = streamBound }))
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "big", Total: orders, Segments: 16, InitialFill: orders})
	errs := make(chan error, orders)
	parallel(64, func(w int) {
		for i := w; i < orders; i += 64 {
			if _, err := e.coord.Allocate(ctx(t), "big", fmt.Sprintf("order-%05d", i), 1, ""); err != nil {
				errs <- err
			}
		}
	})
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var ss []*connect.ServerStreamForClient[stockctlv1.WatchOrdersResponse]
	for range streams {
		sctx, cancel := context.WithTimeout(t.Context(), streamBound)
		t.Cleanup(cancel)
		s, err := smallWindowClient(t, e).WatchOrders(sctx, connect.NewRequest(&stockctlv1.WatchOrdersRequest{Sku: "big", Snapshot: true}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		ss = append(ss, s)
	}
	// No caller reads: SnapshotPagesInFlight streams hold a page each,
	// stuck in their first Send; the others wait for a slot, holding none.
	waitFor(t, "the page slots taken", func() bool { return service.SnapshotPagesHeld(e.srv) == service.SnapshotPagesInFlight })
	runtime.GC()
	var stuck runtime.MemStats
	runtime.ReadMemStats(&stuck)
	grown := int64(stuck.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d snapshot streams of %d orders, none read: heap %+d KiB (%.1f bytes an order a stream; whole snapshots would take ~%d MiB at 540 bytes), %d pages held",
		streams, orders, grown>>10, float64(grown)/orders/streams, orders*streams*540>>20, service.SnapshotPagesHeld(e.srv))
	if limit := int64(128 << 20); grown > limit {
		t.Fatalf("heap grew %d MiB with %d unread snapshot streams, want under %d MiB", grown>>20, streams, limit>>20)
	}
	// Most callers give up (their pages and slots go back); six read, side
	// by side: each gets every order once, and the cursor. (All 60 reading
	// 20,000 orders each took over 5 minutes with -race on a busy 2-core
	// machine.)
	const readers = 6
	for _, s := range ss[readers:] {
		_ = s.Close()
	}
	parallel(readers, func(i int) {
		s := ss[i]
		defer s.Close()
		seen := map[string]bool{}
		for cursor := int64(0); cursor == 0; {
			if !s.Receive() {
				t.Errorf("stream %d ended: %v", i, s.Err())
				return
			}
			m := s.Msg()
			if !m.Snapshot {
				t.Errorf("stream %d: %v, want a snapshot page", i, m)
				return
			}
			for _, ev := range m.Events {
				if seen[ev.Order] {
					t.Errorf("stream %d: order %s twice", i, ev.Order)
					return
				}
				seen[ev.Order] = true
			}
			cursor = m.Cursor
		}
		if len(seen) != orders {
			t.Errorf("stream %d: %d orders, want %d", i, len(seen), orders)
		}
	})
}

// A snapshot page its caller does not take within SnapshotPageTimeout
// ends the stream on the server, and frees its slot.
func TestWatchOrdersSnapshotPageTimeout(t *testing.T) {
	e := newEnv(t, withConfig(func(c *service.Config) { c.SnapshotPageTimeout = 300 * time.Millisecond }))
	createSKU(t, e.grpcStock(t), &stockctlv1.CreateSKURequest{Sku: "big", Total: 3000, Segments: 4, InitialFill: 3000})
	parallel(32, func(w int) {
		for i := w; i < 3000; i += 32 {
			if _, err := e.coord.Allocate(ctx(t), "big", fmt.Sprintf("order-%05d", i), 1, ""); err != nil {
				t.Error(err)
			}
		}
	})
	s, err := smallWindowClient(t, e).WatchOrders(ctx(t), connect.NewRequest(&stockctlv1.WatchOrdersRequest{Sku: "big", Snapshot: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	waitFor(t, "the page stuck", func() bool { return service.SnapshotPagesHeld(e.srv) == 1 })
	// The handler gave up the page (its Send failed): the slot is free.
	waitFor(t, "the stuck page freed", func() bool { return service.SnapshotPagesHeld(e.srv) == 0 })
}

// smallWindowClient is a gRPC client on a connection of its own that
// buffers at most 64 KiB: what its caller does not read stays with the
// server (HTTP/2 flow control).
func smallWindowClient(t *testing.T, e *env) stockctlv1connect.StockServiceClient {
	tr := &http.Transport{HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10, MaxReceiveBufferPerConnection: 64 << 10}}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr.Protocols = &p
	t.Cleanup(tr.CloseIdleConnections)
	return stockctlv1connect.NewStockServiceClient(&http.Client{Transport: tr}, e.url, connect.WithGRPC())
}
