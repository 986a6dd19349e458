package service_test

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
)

// Every StockService method, through each protocol a caller may speak.
func TestStockServiceEveryMethod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			c := e.stock(t, p)
			sku := "phone-" + p.name
			created := createSKU(t, c, &stockctlv1.CreateSKURequest{
				Sku: sku, Total: 100, Segments: 4, InitialFill: 40, LowWatermark: 2, RefillBatch: 5, PerUserLimit: 10,
			})
			if created.Pool != 60 || created.Segments != 4 || created.RefillBatch != 5 || created.CreateTime == nil {
				t.Fatalf("CreateSKU = %v", created)
			}

			alloc := func(order string, qty int64) *stockctlv1.AllocateResponse {
				t.Helper()
				res, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{
					Sku: sku, Order: order, Qty: qty, RouteKey: "user-42", Buyer: "user-42"}))
				if err != nil {
					t.Fatalf("Allocate(%s): %v", order, err)
				}
				return res.Msg
			}
			a := alloc("o-1-"+p.name, 3)
			if a.Replayed || a.Qty != 3 || a.Revision == 0 || len(a.Parts) == 0 || a.Buyer != "user-42" {
				t.Fatalf("Allocate = %v", a)
			}
			again := alloc("o-1-"+p.name, 3)
			if !again.Replayed || again.Revision != a.Revision || fmt.Sprint(again.Parts) != fmt.Sprint(a.Parts) {
				t.Fatalf("retried Allocate = %v, want the first outcome replayed: %v", again, a)
			}

			rres, err := c.Reserve(ctx(t), connect.NewRequest(&stockctlv1.ReserveRequest{
				Sku: sku, Order: "r-1-" + p.name, Qty: 2, Buyer: "user-7", Ttl: durationpb.New(15 * time.Minute)}))
			if err != nil {
				t.Fatal(err)
			}
			if r := rres.Msg; r.State != stockctlv1.OrderState_ORDER_STATE_RESERVED || r.Deadline == nil || r.Replayed {
				t.Fatalf("Reserve = %v", r)
			}
			cres, err := c.Confirm(ctx(t), connect.NewRequest(&stockctlv1.ConfirmRequest{Sku: sku, Order: "r-1-" + p.name}))
			if err != nil {
				t.Fatal(err)
			}
			if cres.Msg.Replayed || cres.Msg.Qty != 2 || cres.Msg.Deadline == nil {
				t.Fatalf("Confirm = %v", cres.Msg)
			}
			if again, err := c.Confirm(ctx(t), connect.NewRequest(&stockctlv1.ConfirmRequest{Sku: sku, Order: "r-1-" + p.name})); err != nil || !again.Msg.Replayed {
				t.Fatalf("second Confirm = %v, %v; want replayed", again, err)
			}

			if _, err := c.Reserve(ctx(t), connect.NewRequest(&stockctlv1.ReserveRequest{
				Sku: sku, Order: "r-2-" + p.name, Qty: 1, Buyer: "user-8", Ttl: durationpb.New(time.Hour)})); err != nil {
				t.Fatal(err)
			}
			cancelled, err := c.Cancel(ctx(t), connect.NewRequest(&stockctlv1.CancelRequest{Sku: sku, Order: "r-2-" + p.name}))
			if err != nil || cancelled.Msg.Replayed || cancelled.Msg.Qty != 1 {
				t.Fatalf("Cancel = %v, %v", cancelled, err)
			}
			if again, err := c.Cancel(ctx(t), connect.NewRequest(&stockctlv1.CancelRequest{Sku: sku, Order: "r-2-" + p.name})); err != nil || !again.Msg.Replayed {
				t.Fatalf("second Cancel = %v, %v; want replayed", again, err)
			}

			rel, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.ReleaseRequest{Sku: sku, Order: "o-1-" + p.name}))
			if err != nil || rel.Msg.Replayed || rel.Msg.Qty != 3 || rel.Msg.State != stockctlv1.OrderState_ORDER_STATE_ALLOCATED {
				t.Fatalf("Release = %v, %v", rel, err)
			}
			if again, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.ReleaseRequest{Sku: sku, Order: "o-1-" + p.name})); err != nil || !again.Msg.Replayed {
				t.Fatalf("second Release = %v, %v; want replayed", again, err)
			}

			rs, err := c.Restock(ctx(t), connect.NewRequest(&stockctlv1.RestockRequest{Sku: sku, Qty: 50, Delivery: "dlv-" + p.name}))
			if err != nil || rs.Msg.Total != 150 || rs.Msg.Qty != 50 || rs.Msg.Replayed || rs.Msg.Delivery != "dlv-"+p.name {
				t.Fatalf("Restock = %v, %v", rs, err)
			}
			rsAgain, err := c.Restock(ctx(t), connect.NewRequest(&stockctlv1.RestockRequest{Sku: sku, Qty: 50, Delivery: "dlv-" + p.name}))
			if err != nil || !rsAgain.Msg.Replayed || rsAgain.Msg.Total != 150 || rsAgain.Msg.Revision != rs.Msg.Revision {
				t.Fatalf("second Restock = %v, %v; want replayed, adding nothing", rsAgain, err)
			}

			st := status(t, c, sku)
			// 2 units confirmed remain allocated; everything else is back.
			if st.Total != 150 || st.Allocated != 2 || st.Remaining != 148 || len(st.Segments) != 4 || st.Orders != 3 ||
				st.PerUserLimit != 10 || st.RefillBatch != 5 || st.Revision < rs.Msg.Revision {
				t.Fatalf("Status = %v", st)
			}
			au := audit(t, c, sku)
			if au.Total != 150 || au.Allocated != 2 || au.Confirmed != 2 || au.Orders != 3 || au.ReleasedOrders != 2 ||
				au.Deliveries != 1 || au.Delivered != 50 {
				t.Fatalf("Audit = %v", au)
			}
		})
	}
}

// Every error a StockService call can end with, each with its code, its
// reason and (over Connect) its HTTP status; and each leaves the books as
// they were.
func TestStockServiceErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "tv", Total: 10, Segments: 2, InitialFill: 10})
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "limited", Total: 100, Segments: 2, InitialFill: 50, PerUserLimit: 2})
	if _, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "tv", Order: "plain", Qty: 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx(t), connect.NewRequest(&stockctlv1.ReserveRequest{Sku: "tv", Order: "short", Qty: 1, Ttl: durationpb.New(time.Second)})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx(t), connect.NewRequest(&stockctlv1.ReserveRequest{Sku: "tv", Order: "cancelled", Qty: 1, Ttl: durationpb.New(time.Hour)})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx(t), connect.NewRequest(&stockctlv1.CancelRequest{Sku: "tv", Order: "cancelled"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Restock(ctx(t), connect.NewRequest(&stockctlv1.RestockRequest{Sku: "limited", Qty: 1, Delivery: "dlv-seed"})); err != nil {
		t.Fatal(err)
	}
	// "gone" is applied, then archived by prune (an operator's command):
	// its ID is kept, so a retry is refused.
	if _, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "limited", Order: "gone", Qty: 1, Buyer: "u-2"})); err != nil {
		t.Fatal(err)
	}
	if p, err := e.coord.Prune(ctx(t), "limited", time.Now().Add(time.Hour)); err != nil || p.Orders != 1 {
		t.Fatalf("prune: %+v, %v", p, err)
	}
	// Status and Audit say what the archive holds: the balance a client
	// makes from their fields holds after a prune.
	if st, err := c.Status(ctx(t), connect.NewRequest(&stockctlv1.StatusRequest{Sku: "limited"})); err != nil {
		t.Fatal(err)
	} else if s := st.Msg.Status; s.Archived != 1 || s.ArchivedOrders != 1 || s.PrunedClaims != 1 || s.Orders != 0 || s.Allocated != 1 {
		t.Fatalf("status after a prune: %v", s)
	}
	if au, err := c.Audit(ctx(t), connect.NewRequest(&stockctlv1.AuditRequest{Sku: "limited"})); err != nil {
		t.Fatal(err)
	} else if a := au.Msg; !a.Ok || a.Archived != 1 || a.ArchivedOrders != 1 || a.PrunedClaims != 1 || a.Total != a.Pool+a.Segments+a.Allocated+a.Archived {
		t.Fatalf("audit after a prune: %v", a)
	}
	// Let "short" pass its deadline: Confirm then finds it expired.
	time.Sleep(1100 * time.Millisecond)
	if _, err := c.Confirm(ctx(t), connect.NewRequest(&stockctlv1.ConfirmRequest{Sku: "tv", Order: "short"})); err == nil {
		t.Fatal("Confirm of an expired reservation succeeded")
	}

	type call func(c clients) error
	cases := []struct {
		name   string
		call   call
		code   connect.Code
		reason stockctlv1.ErrorReason
		http   int
		field  string
	}{
		{"qty 0", func(c clients) error { return c.allocate("tv", "x-1", 0, "") }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, "qty"},
		{"bad sku", func(c clients) error { return c.allocate("no/slash", "x-2", 1, "") }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, "sku"},
		{"bad buyer", func(c clients) error { return c.allocate("tv", "x-3", 1, "has space") }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, "buyer"},
		{"no ttl", func(c clients) error { return c.reserve("tv", "x-4", 1, nil) }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, "ttl"},
		{"ttl too long", func(c clients) error { return c.reserve("tv", "x-5", 1, durationpb.New(48*time.Hour)) }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, "ttl"},
		{"bad create", func(c clients) error { return c.create("new", 10, 0) }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, "segments"},
		{"unknown sku", func(c clients) error { return c.allocate("nope", "x-6", 1, "") }, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_SKU_NOT_FOUND, 404, ""},
		{"unknown sku status", func(c clients) error { return c.status("nope") }, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_SKU_NOT_FOUND, 404, ""},
		{"unknown order", func(c clients) error { return c.release("tv", "never") }, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_ORDER_NOT_FOUND, 404, ""},
		{"sku exists", func(c clients) error { return c.create("tv", 10, 2) }, connect.CodeAlreadyExists, stockctlv1.ErrorReason_ERROR_REASON_SKU_EXISTS, 409, ""},
		{"order reused with another qty", func(c clients) error { return c.allocate("tv", "plain", 2, "") }, connect.CodeAlreadyExists, stockctlv1.ErrorReason_ERROR_REASON_ORDER_CONFLICT, 409, ""},
		{"confirm a plain allocation", func(c clients) error { return c.confirm("tv", "plain") }, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_ORDER_STATE_CONFLICT, 400, ""},
		{"confirm a cancelled reservation", func(c clients) error { return c.confirm("tv", "cancelled") }, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_ORDER_STATE_CONFLICT, 400, ""},
		{"sold out", func(c clients) error { return c.allocate("tv", "x-7", 100, "") }, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_INSUFFICIENT_STOCK, 400, ""},
		{"per-user limit", func(c clients) error { return c.allocate("limited", "x-8", 3, "u-1") }, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_PER_USER_LIMIT_EXCEEDED, 400, ""},
		{"limit needs a buyer", func(c clients) error { return c.allocate("limited", "x-9", 1, "") }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, ""},
		{"expired", func(c clients) error { return c.confirm("tv", "short") }, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_RESERVATION_EXPIRED, 400, ""},
		{"restock without a delivery", func(c clients) error { return c.restock("tv", 1, "") }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, "delivery"},
		{"restock bad delivery", func(c clients) error { return c.restock("tv", 1, "a/b") }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, "delivery"},
		{"restock qty 0", func(c clients) error { return c.restock("tv", 0, "dlv-0") }, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, 400, "qty"},
		{"delivery reused with another qty", func(c clients) error { return c.restock("limited", 2, "dlv-seed") }, connect.CodeAlreadyExists, stockctlv1.ErrorReason_ERROR_REASON_DELIVERY_CONFLICT, 409, ""},
		{"retry of a pruned order", func(c clients) error { return c.allocate("limited", "gone", 1, "u-2") }, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_ORDER_PRUNED, 400, ""},
		{"release of a pruned order", func(c clients) error { return c.release("limited", "gone") }, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_ORDER_PRUNED, 400, ""},
		{"delivery reused for another sku", func(c clients) error { return c.restock("tv", 1, "dlv-seed") }, connect.CodeAlreadyExists, stockctlv1.ErrorReason_ERROR_REASON_DELIVERY_CONFLICT, 409, ""},
	}
	before := map[string]*stockctlv1.StockStatus{"tv": status(t, c, "tv"), "limited": status(t, c, "limited")}
	for _, p := range protocols {
		cl := clients{t: t, c: e.stock(t, p)}
		for _, tc := range cases {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				cl.t = t
				err := tc.call(cl)
				wantError(t, tc.name, err, tc.code, tc.reason)
				if tc.field != "" {
					br := detail[*errdetails.BadRequest](t, err)
					if len(br.FieldViolations) != 1 || br.FieldViolations[0].Field != tc.field {
						t.Errorf("BadRequest %v, want the field %q", br, tc.field)
					}
				}
			})
		}
	}
	// The HTTP statuses, through plain HTTP/1.1 with JSON (curl's view).
	for _, tc := range cases {
		if got := httpStatusOf(t, e, tc.call); got != tc.http {
			t.Errorf("%s: HTTP status %d, want %d", tc.name, got, tc.http)
		}
	}
	// Nothing changed: the books are as they were (the etcd revision
	// moves: refusals take and give back locks), and they balance.
	for sku, st := range before {
		after := status(t, c, sku)
		st.Revision, after.Revision = 0, 0
		if !proto.Equal(st, after) {
			t.Errorf("%s: refused calls changed the stock:\nbefore %v\nafter  %v", sku, st, after)
		}
		audit(t, c, sku)
	}

	// The typed details of a refusal carry what a program needs.
	err := clients{t: t, c: c}.allocate("tv", "x-10", 100, "")
	is := detail[*stockctlv1.InsufficientStock](t, err)
	if is.Sku != "tv" || is.Want != 100 || is.Remaining != 9 || is.Revision == 0 {
		t.Errorf("InsufficientStock = %v, want 100 wanted and 9 remaining", is)
	}
	err = clients{t: t, c: c}.allocate("limited", "x-11", 3, "u-1")
	if le := detail[*stockctlv1.PerUserLimitExceeded](t, err); le.Limit != 2 || le.Want != 3 || le.Buyer != "u-1" {
		t.Errorf("PerUserLimitExceeded = %v", le)
	}
	err = clients{t: t, c: c}.confirm("tv", "short")
	if re := detail[*stockctlv1.ReservationExpired](t, err); re.Order != "short" || re.Deadline == nil {
		t.Errorf("ReservationExpired = %v", re)
	}
	err = clients{t: t, c: c}.allocate("limited", "gone", 1, "u-2")
	if op := detail[*stockctlv1.OrderPruned](t, err); op.Sku != "limited" || op.Order != "gone" || op.Pruned == nil {
		t.Errorf("OrderPruned = %v", op)
	}
}
