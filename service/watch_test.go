package service_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
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
