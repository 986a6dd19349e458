package service_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// WatchStatus sends the status at once, then after changes; revisions only
// grow and the last frame shows the last change.
func TestWatchStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, p := range []protocol{protocols[0], connectJSON} { // gRPC, and Connect's streaming over HTTP/1.1
		t.Run(p.name, func(t *testing.T) {
			c := e.stock(t, p)
			sku := "watch-" + p.name
			createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: sku, Total: 100, Segments: 2, InitialFill: 100})
			stream, err := c.WatchStatus(ctx(t), connect.NewRequest(&stockctlv1.WatchStatusRequest{Sku: sku, MinInterval: durationpb.New(10 * time.Millisecond)}))
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			if !stream.Receive() {
				t.Fatalf("no first frame: %v", stream.Err())
			}
			last := stream.Msg().Status
			if last.Remaining != 100 {
				t.Fatalf("first frame %v", last)
			}
			const orders = 5
			go func() {
				for i := range orders {
					_, _ = c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: sku, Order: sku + "-" + string(rune('a'+i)), Qty: 1}))
				}
			}()
			for last.Remaining > 100-orders {
				if !stream.Receive() {
					t.Fatalf("stream ended: %v", stream.Err())
				}
				f := stream.Msg().Status
				if f.Revision <= last.Revision || f.Remaining > last.Remaining || f.Total != f.Remaining+f.Allocated {
					t.Fatalf("frame %v after %v: want a later revision, no more stock, and balanced books", f, last)
				}
				last = f
			}
			if last.Orders != orders {
				t.Fatalf("last frame %v, want %d orders", last, orders)
			}
		})
	}
	stream, err := e.grpcStock(t).WatchStatus(ctx(t), connect.NewRequest(&stockctlv1.WatchStatusRequest{Sku: "nope"}))
	if err == nil {
		defer stream.Close()
		if stream.Receive() {
			t.Fatalf("a frame for an unknown SKU: %v", stream.Msg())
		}
		err = stream.Err()
	}
	wantError(t, "WatchStatus of an unknown SKU", err, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_SKU_NOT_FOUND)
}

// WatchStatus follows the sales of a process that sells the SKU lazily
// (coordinator.WithLazySegments: its orders after the first write only
// their records). Its first order moves a counter and is seen; the four
// after it moved no key the watch followed, and the stream went quiet
// until its deadline.
func TestWatchStatusFollowsLazySales(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lazy, err := coordinator.New(e.etcd.Client(t), coordinator.WithLazySegments())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lazy.Close() })
	c := e.stock(t, protocols[0])
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "lazy-watch", Total: 100, Segments: 2, InitialFill: 100})
	wctx, cancel := context.WithTimeout(ctx(t), etcdtest.MinWait)
	defer cancel()
	stream, err := c.WatchStatus(wctx, connect.NewRequest(&stockctlv1.WatchStatusRequest{Sku: "lazy-watch", MinInterval: durationpb.New(10 * time.Millisecond)}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	until := func(remaining int64) *stockctlv1.StockStatus {
		t.Helper()
		for {
			if !stream.Receive() {
				t.Fatalf("the stream ended before a frame with %d remaining: %v", remaining, stream.Err())
			}
			if st := stream.Msg().Status; st.Remaining <= remaining {
				return st
			}
		}
	}
	sell := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := lazy.Allocate(ctx(t), "lazy-watch", fmt.Sprintf("l%d", i), 1, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	until(100)
	sell(0, 1)
	until(99)
	sell(1, 5)
	if st := until(95); st.Remaining != 95 || st.Orders != 5 {
		t.Fatalf("frame %v, want 95 remaining in 5 orders", st)
	}
}
