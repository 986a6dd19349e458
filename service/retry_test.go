package service_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
)

// A retry of one order through another server (another process, with its
// own coordinator, on the same etcd) returns the first outcome and deducts
// nothing: what a client behind a load balancer does after a timeout.
func TestRetryThroughAnotherServer(t *testing.T) {
	t.Parallel()
	a := newEnv(t)
	b := newEnv(t, onEtcd(a.etcd))
	ca, cb := a.grpcStock(t), b.stock(t, connectJSON)
	createSKU(t, ca, &stockctlv1.CreateSKURequest{Sku: "shoe", Total: 1000, Segments: 4, InitialFill: 400})

	first, err := ca.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "shoe", Order: "o-1", Qty: 3, RouteKey: "u-1"}))
	if err != nil {
		t.Fatal(err)
	}
	retry, err := cb.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "shoe", Order: "o-1", Qty: 3, RouteKey: "u-1"}))
	if err != nil {
		t.Fatal(err)
	}
	if !retry.Msg.Replayed || retry.Msg.Revision != first.Msg.Revision || fmt.Sprint(retry.Msg.Parts) != fmt.Sprint(first.Msg.Parts) {
		t.Fatalf("retry through B = %v, want A's outcome %v replayed", retry.Msg, first.Msg)
	}

	// A reservation made through one server is confirmed through the other.
	if _, err := cb.Reserve(ctx(t), connect.NewRequest(&stockctlv1.ReserveRequest{Sku: "shoe", Order: "r-1", Qty: 2, Ttl: durationpb.New(time.Hour)})); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Confirm(ctx(t), connect.NewRequest(&stockctlv1.ConfirmRequest{Sku: "shoe", Order: "r-1"})); err != nil {
		t.Fatal(err)
	}

	// Duplicates of one order sent at once through both servers: exactly
	// one deducts, the others replay its outcome.
	const dups = 16
	for round := range 5 {
		order := fmt.Sprintf("dup-%d", round)
		var served, replayed atomic.Int32
		parallel(dups, func(i int) {
			c := ca
			if i%2 == 1 {
				c = cb
			}
			res, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "shoe", Order: order, Qty: 2}))
			if err != nil {
				t.Errorf("duplicate %d of %s: %v", i, order, err)
				return
			}
			if res.Msg.Replayed {
				replayed.Add(1)
			} else {
				served.Add(1)
			}
		})
		if served.Load() != 1 || replayed.Load() != dups-1 {
			t.Fatalf("%s: %d served, %d replayed; want 1 and %d", order, served.Load(), replayed.Load(), dups-1)
		}
	}
	au := audit(t, cb, "shoe")
	if want := int64(3 + 2 + 5*2); au.Allocated != want {
		t.Fatalf("allocated %d, want %d (each order once)", au.Allocated, want)
	}
}
