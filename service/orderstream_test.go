package service_test

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
)

// orderStream runs reqs on one OrderStream, sent from several goroutines
// at once, and returns the answers by id.
func orderStream(t *testing.T, c stockctlv1connect.StockServiceClient, reqs []*stockctlv1.OrderStreamRequest) map[int64]*stockctlv1.OrderStreamResponse {
	t.Helper()
	st := c.OrderStream(ctx(t))
	var mu sync.Mutex
	var sendErr error
	parallel(8, func(g int) {
		// Goroutine 0 sends its orders in messages of 5 (in more), the
		// others one a message.
		var batch []*stockctlv1.OrderStreamRequest
		for i := g; i < len(reqs); i += 8 {
			batch = append(batch, reqs[i])
			if g == 0 && len(batch) < 5 && i+8 < len(reqs) {
				continue
			}
			msg := batch[0]
			if len(batch) > 1 {
				msg = &stockctlv1.OrderStreamRequest{More: batch}
			}
			batch = nil
			mu.Lock()
			if err := st.Send(msg); err != nil && sendErr == nil {
				sendErr = err
			}
			mu.Unlock()
		}
	})
	if sendErr != nil {
		t.Fatalf("Send: %v", sendErr)
	}
	if err := st.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	got := map[int64]*stockctlv1.OrderStreamResponse{}
	for {
		res, err := st.Receive()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		all := res.More
		if res.Outcome != nil {
			all = append(all, res)
		}
		for _, r := range all {
			if got[r.Id] != nil {
				t.Fatalf("id %d answered twice", r.Id)
			}
			got[r.Id] = r
		}
	}
	if err := st.CloseResponse(); err != nil {
		t.Fatal(err)
	}
	return got
}

// OrderStream: many orders on one stream, one or several a message, each
// answered with its own id and outcome (allocated, reserved, replayed, refused with its reason and
// detail, invalid), the books exact, and a retry of the whole stream
// replayed: idempotency by order ID as for Allocate.
func TestOrderStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "hot", Total: 150, Segments: 4, InitialFill: 100, LowWatermark: 1})
	const n = 200
	var reqs []*stockctlv1.OrderStreamRequest
	for i := range n {
		r := &stockctlv1.OrderStreamRequest{Id: int64(1000 + i)}
		if i%4 == 0 {
			r.Order = &stockctlv1.OrderStreamRequest_Reserve{Reserve: &stockctlv1.ReserveRequest{
				Sku: "hot", Order: fmt.Sprintf("r-%d", i), Qty: 1, Ttl: durationpb.New(time.Hour)}}
		} else {
			r.Order = &stockctlv1.OrderStreamRequest_Allocate{Allocate: &stockctlv1.AllocateRequest{
				Sku: "hot", Order: fmt.Sprintf("o-%d", i), Qty: 1, RouteKey: fmt.Sprint(i)}}
		}
		reqs = append(reqs, r)
	}
	bad := []*stockctlv1.OrderStreamRequest{
		{Id: 1},
		{Id: 2, Order: &stockctlv1.OrderStreamRequest_Allocate{Allocate: &stockctlv1.AllocateRequest{Sku: "hot", Order: "x y", Qty: 1}}},
		{Id: 3, Order: &stockctlv1.OrderStreamRequest_Reserve{Reserve: &stockctlv1.ReserveRequest{Sku: "hot", Order: "no-ttl", Qty: 1}}},
	}
	tally := func(got map[int64]*stockctlv1.OrderStreamResponse) (sold, refused, replayed int) {
		t.Helper()
		if len(got) != n+len(bad) {
			t.Fatalf("%d answers, want %d", len(got), n+len(bad))
		}
		for _, r := range reqs {
			res := got[r.Id]
			switch o := res.Outcome.(type) {
			case *stockctlv1.OrderStreamResponse_Allocated:
				if o.Allocated.Order != r.GetAllocate().GetOrder() {
					t.Fatalf("id %d answered for order %s, sent %v", r.Id, o.Allocated.Order, r)
				}
				sold++
				if o.Allocated.Replayed {
					replayed++
				}
			case *stockctlv1.OrderStreamResponse_Reserved:
				if o.Reserved.Order != r.GetReserve().GetOrder() || o.Reserved.State != stockctlv1.OrderState_ORDER_STATE_RESERVED {
					t.Fatalf("id %d: %v for %v", r.Id, o.Reserved, r)
				}
				sold++
				if o.Reserved.Replayed {
					replayed++
				}
			case *stockctlv1.OrderStreamResponse_Error:
				if o.Error.Reason != stockctlv1.ErrorReason_ERROR_REASON_INSUFFICIENT_STOCK || o.Error.Code != "failed_precondition" || len(o.Error.Details) < 2 {
					t.Fatalf("id %d: error %v, want INSUFFICIENT_STOCK with its details", r.Id, o.Error)
				}
				var is stockctlv1.InsufficientStock
				if err := o.Error.Details[1].UnmarshalTo(&is); err != nil || is.Sku != "hot" || is.Want != 1 {
					t.Fatalf("id %d: detail %v (%v)", r.Id, &is, err)
				}
				refused++
			default:
				t.Fatalf("id %d: no outcome", r.Id)
			}
		}
		for _, b := range bad {
			o := got[b.Id].GetError()
			if o == nil || o.Reason != stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT || o.Code != "invalid_argument" {
				t.Fatalf("id %d (%v): %v, want INVALID_ARGUMENT", b.Id, b, got[b.Id])
			}
		}
		return
	}
	sold, refused, replayed := tally(orderStream(t, c, append(reqs, bad...)))
	if sold != 150 || refused != n-150 || replayed != 0 {
		t.Fatalf("sold %d, refused %d, replayed %d; want 150, %d, 0", sold, refused, replayed, n-150)
	}
	// The same orders again: the sold ones replayed, nothing deducted.
	sold2, _, replayed2 := tally(orderStream(t, c, append(reqs, bad...)))
	if sold2 != 150 || replayed2 != 150 {
		t.Fatalf("retry: sold %d, replayed %d; want 150, 150", sold2, replayed2)
	}
	if a := audit(t, c, "hot"); !a.Ok || a.Allocated != 150 || a.Orders != 150 {
		t.Fatalf("audit %v", a)
	}
}

// ListSKUs pages in name order, every SKU once, whatever the page size; a
// bad page size or token is INVALID_ARGUMENT naming it.
func TestListSKUs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	var want []string
	for i := range 7 {
		sku := fmt.Sprintf("sku-%02d", i)
		createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: sku, Total: 1, Segments: 1})
		want = append(want, sku)
	}
	for _, size := range []int32{0, 1, 3, 7, 1000} {
		var got []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatalf("page size %d: more than 10 pages", size)
			}
			res, err := c.ListSKUs(ctx(t), connect.NewRequest(&stockctlv1.ListSKUsRequest{PageSize: size, PageToken: token}))
			if err != nil {
				t.Fatal(err)
			}
			if size > 0 && len(res.Msg.Skus) > int(size) {
				t.Fatalf("page of %d for size %d", len(res.Msg.Skus), size)
			}
			if len(res.Msg.Clusters) != 0 {
				t.Fatalf("a server of one cluster names clusters: %v", res.Msg.Clusters)
			}
			got = append(got, res.Msg.Skus...)
			if token = res.Msg.NextPageToken; token == "" {
				break
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("page size %d: %v, want %v", size, got, want)
		}
	}
	for _, tc := range []struct {
		name  string
		req   *stockctlv1.ListSKUsRequest
		field string
	}{
		{"negative size", &stockctlv1.ListSKUsRequest{PageSize: -1}, "page_size"},
		{"size too large", &stockctlv1.ListSKUsRequest{PageSize: 1001}, "page_size"},
		{"forged token", &stockctlv1.ListSKUsRequest{PageToken: "sku-03"}, "page_token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.ListSKUs(ctx(t), connect.NewRequest(tc.req))
			wantError(t, tc.name, err, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
			if f := detail[*errdetails.BadRequest](t, err); len(f.FieldViolations) == 0 || f.FieldViolations[0].Field != tc.field {
				t.Fatalf("BadRequest %v, want field %s", f, tc.field)
			}
		})
	}
}
