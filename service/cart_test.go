package service_test

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
)

// AllocateOrder and ReserveOrder over every protocol: every line served in
// one commit (one revision), a retry replayed whole, other lines
// ORDER_CONFLICT, a refusal INSUFFICIENT_STOCK (or PER_USER_LIMIT_EXCEEDED)
// with a RefusedLine detail naming the line beside the line's own detail,
// nothing deducted; Confirm and Release with one line's SKU move the whole
// order; the books balance.
func TestStockServiceOrdersOfSeveralLines(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "phone", Total: 100, Segments: 2, InitialFill: 50})
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "case", Total: 100, Segments: 1, InitialFill: 10})
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "rare", Total: 1, Segments: 1, PerUserLimit: 1})
	lines := func(qty ...int64) []*stockctlv1.OrderLine {
		skus := []string{"phone", "case", "rare"}
		var out []*stockctlv1.OrderLine
		for i, q := range qty {
			out = append(out, &stockctlv1.OrderLine{Sku: skus[i], Qty: q})
		}
		return out
	}
	for i, p := range protocols {
		cl := e.stock(t, p)
		t.Run(p.name, func(t *testing.T) {
			order := "cart-" + p.name
			req := &stockctlv1.AllocateOrderRequest{Order: order, Lines: lines(2, 1)}
			a, err := cl.AllocateOrder(ctx(t), connect.NewRequest(req))
			if err != nil {
				t.Fatal(err)
			}
			if len(a.Msg.Lines) != 2 || a.Msg.Lines[0].Sku != "phone" || a.Msg.Lines[1].Qty != 1 ||
				a.Msg.Lines[1].Revision != a.Msg.Revision || a.Msg.Replayed {
				t.Fatalf("AllocateOrder: %v", a.Msg)
			}
			again, err := cl.AllocateOrder(ctx(t), connect.NewRequest(req))
			if err != nil || !again.Msg.Replayed || again.Msg.Revision != a.Msg.Revision {
				t.Fatalf("retry: %v, %v", again, err)
			}
			_, err = cl.AllocateOrder(ctx(t), connect.NewRequest(&stockctlv1.AllocateOrderRequest{Order: order, Lines: lines(3, 1)}))
			wantError(t, "other lines", err, connect.CodeAlreadyExists, stockctlv1.ErrorReason_ERROR_REASON_ORDER_CONFLICT)

			before := status(t, c, "case")
			_, err = cl.AllocateOrder(ctx(t), connect.NewRequest(&stockctlv1.AllocateOrderRequest{Order: order + "-big", Lines: lines(1, 1000)}))
			wantError(t, "a short line", err, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_INSUFFICIENT_STOCK)
			if rl := detail[*stockctlv1.RefusedLine](t, err); rl.Index != 1 || rl.Sku != "case" || rl.Qty != 1000 {
				t.Fatalf("RefusedLine %v, want line 1 (case, 1000)", rl)
			}
			if is := detail[*stockctlv1.InsufficientStock](t, err); is.Sku != "case" || is.Want != 1000 || is.Revision == 0 {
				t.Fatalf("InsufficientStock %v", is)
			}
			after := status(t, c, "case")
			if after.Pool != before.Pool || after.Allocated != before.Allocated {
				t.Fatalf("a refused order changed case: %v -> %v", before, after)
			}

			// The rare unit: served to the first protocol's buyer, then
			// the limit (for the same buyer) or the stock refuses.
			_, err = cl.ReserveOrder(ctx(t), connect.NewRequest(&stockctlv1.ReserveOrderRequest{Order: order + "-r",
				Lines: lines(1, 1, 1), Buyer: "ann", Ttl: durationpb.New(time.Hour)}))
			if i == 0 {
				if err != nil {
					t.Fatal(err)
				}
				cf, err := cl.Confirm(ctx(t), connect.NewRequest(&stockctlv1.ConfirmRequest{Sku: "rare", Order: order + "-r"}))
				if err != nil || cf.Msg.Sku != "rare" {
					t.Fatalf("confirm through one line: %v, %v", cf, err)
				}
				if st := status(t, c, "phone"); st.Reserved != 0 {
					t.Fatalf("phone still reserved after the order's confirm: %v", st)
				}
			} else {
				wantError(t, "the rare unit again", err, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_INSUFFICIENT_STOCK)
				if rl := detail[*stockctlv1.RefusedLine](t, err); rl.Index != 2 || rl.Sku != "rare" {
					t.Fatalf("RefusedLine %v, want line 2 (rare)", rl)
				}
			}
			r, err := cl.Release(ctx(t), connect.NewRequest(&stockctlv1.ReleaseRequest{Sku: "case", Order: order}))
			if err != nil || r.Msg.Replayed {
				t.Fatalf("release through one line: %v, %v", r, err)
			}
		})
	}
	for _, sku := range []string{"phone", "case", "rare"} {
		audit(t, c, sku)
	}
	if st := status(t, c, "phone"); st.Allocated != 1 {
		t.Fatalf("phone allocated %d, want the confirmed order's 1 (the carts were released)", st.Allocated)
	}
}

// Orders of several SKUs on OrderStream: carts near a sell-out answered
// each on its own (allocated_order, reserved_order, or an error with the
// RefusedLine detail), a retry of the stream replayed whole, the books
// holding exactly the carts served.
func TestOrderStreamCarts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "a", Total: 20, Segments: 2, InitialFill: 10})
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "b", Total: 30, Segments: 2, InitialFill: 10})
	const n = 40
	var reqs []*stockctlv1.OrderStreamRequest
	for i := range n {
		lines := []*stockctlv1.OrderLine{{Sku: "a", Qty: 1}, {Sku: "b", Qty: 1}}
		r := &stockctlv1.OrderStreamRequest{Id: int64(i + 1)}
		if i%2 == 0 {
			r.Order = &stockctlv1.OrderStreamRequest_ReserveOrder{ReserveOrder: &stockctlv1.ReserveOrderRequest{
				Order: fmt.Sprintf("cart-%d", i), Lines: lines, Ttl: durationpb.New(time.Hour)}}
		} else {
			r.Order = &stockctlv1.OrderStreamRequest_AllocateOrder{AllocateOrder: &stockctlv1.AllocateOrderRequest{
				Order: fmt.Sprintf("cart-%d", i), Lines: lines}}
		}
		reqs = append(reqs, r)
	}
	tally := func(got map[int64]*stockctlv1.OrderStreamResponse) (served, refused, replayed int) {
		t.Helper()
		for _, r := range reqs {
			switch o := got[r.Id].GetOutcome().(type) {
			case *stockctlv1.OrderStreamResponse_AllocatedOrder:
				if o.AllocatedOrder.Order != r.GetAllocateOrder().GetOrder() || len(o.AllocatedOrder.Lines) != 2 {
					t.Fatalf("id %d: %v for %v", r.Id, o.AllocatedOrder, r)
				}
				served++
				if o.AllocatedOrder.Replayed {
					replayed++
				}
			case *stockctlv1.OrderStreamResponse_ReservedOrder:
				if o.ReservedOrder.Order != r.GetReserveOrder().GetOrder() || o.ReservedOrder.State != stockctlv1.OrderState_ORDER_STATE_RESERVED {
					t.Fatalf("id %d: %v for %v", r.Id, o.ReservedOrder, r)
				}
				served++
				if o.ReservedOrder.Replayed {
					replayed++
				}
			case *stockctlv1.OrderStreamResponse_Error:
				if o.Error.Reason != stockctlv1.ErrorReason_ERROR_REASON_INSUFFICIENT_STOCK {
					t.Fatalf("id %d: error %v", r.Id, o.Error)
				}
				var found bool
				for _, d := range o.Error.Details {
					var rl stockctlv1.RefusedLine
					if d.UnmarshalTo(&rl) == nil {
						found = rl.Sku == "a" && rl.Index == 0
					}
				}
				if !found {
					t.Fatalf("id %d: no RefusedLine naming a's line in %v", r.Id, o.Error)
				}
				refused++
			default:
				t.Fatalf("id %d: no outcome", r.Id)
			}
		}
		return
	}
	served, refused, replayed := tally(orderStream(t, c, reqs))
	if served != 20 || refused != n-20 || replayed != 0 {
		t.Fatalf("served %d, refused %d, replayed %d; want 20, %d, 0", served, refused, replayed, n-20)
	}
	served2, _, replayed2 := tally(orderStream(t, c, reqs))
	if served2 != 20 || replayed2 != 20 {
		t.Fatalf("retry: served %d, replayed %d; want 20, 20", served2, replayed2)
	}
	// WatchOrders: every event of a cart carries its lines, and the two
	// lines of each placement share a revision (so one message).
	ws := watchOrders(t, c, ctx(t), &stockctlv1.WatchOrdersRequest{})
	ws.until(t, 40, 0)
	perRev := map[int64]int{}
	for _, ev := range ws.events {
		if len(ev.Lines) != 2 || ev.Lines[0] != "a" || ev.Lines[1] != "b" {
			t.Fatalf("event %v: lines %v", ev, ev.Lines)
		}
		perRev[ev.Revision]++
	}
	for rev, n := range perRev {
		if n%2 != 0 {
			t.Fatalf("revision %d holds %d lines of carts of 2", rev, n)
		}
	}
	for sku, want := range map[string]int64{"a": 20, "b": 20} {
		if a := audit(t, c, sku); !a.Ok || a.Allocated != want {
			t.Fatalf("audit %s: %v", sku, a)
		}
	}
}
