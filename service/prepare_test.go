package service_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/internal/engines"
)

// Prepare through the API readies the server's coordinator as the library
// call does: its answer counts the SKUs, the server then owns each SKU's
// segment for it (a counter naming it), and an order sells. Bad input (no
// names, too many, an invalid or unknown SKU) is refused with the field or
// the SKU named, over gRPC and plain JSON, and writes nothing.
func TestPrepare(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	var skus []string
	for i := range 5 {
		skus = append(skus, fmt.Sprint("tee-", i))
		createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: skus[i], Total: 20, Segments: 2, InitialFill: 20})
	}
	raw := e.etcd.Client(t)
	revNow := func() int64 {
		t.Helper()
		resp, err := raw.Get(ctx(t), "rev")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	before := revNow()
	for _, tc := range []struct {
		name   string
		skus   []string
		reason string
		says   string
	}{
		{"no SKUs", nil, "INVALID_ARGUMENT", "skus"},
		{"too many", make([]string, 1001), "INVALID_ARGUMENT", "1 to 1000"},
		{"invalid", []string{"tee-0", "a b"}, "INVALID_ARGUMENT", `"a b"`},
		{"unknown", []string{"tee-0", "hoodie"}, "SKU_NOT_FOUND", "hoodie"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Prepare(ctx(t), connect.NewRequest(&stockctlv1.PrepareRequest{Skus: tc.skus}))
			if err == nil {
				t.Fatalf("Prepare(%d names): no error, want %s", len(tc.skus), tc.reason)
			}
			if _, got := errorInfo(t, err); got != tc.reason || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Prepare(%d names) = %v (%s); want %s saying %s", len(tc.skus), err, got, tc.reason, tc.says)
			}
		})
	}
	code, we, body := post(t, e, "/stockctl.v1.StockService/Prepare", "application/json", "", []byte(`{"skus":["tee-1","nope"]}`))
	if code != http.StatusNotFound || reasonOf(we) != "SKU_NOT_FOUND" || !strings.Contains(we.Message, "nope") {
		t.Fatalf("JSON Prepare of an unknown SKU: %d %s", code, body)
	}
	if after := revNow(); after != before {
		t.Fatalf("refused Prepares moved the revision from %d to %d", before, after)
	}

	res, err := c.Prepare(ctx(t), connect.NewRequest(&stockctlv1.PrepareRequest{Skus: append(skus, skus[0])}))
	if err != nil {
		t.Fatal(err)
	}
	if m := res.Msg; m.Skus != 5 || m.Ready != 5 || m.Owned != 5 || m.Skipped != 0 {
		t.Fatalf("Prepare = %v, want 5 SKUs ready and owned", m)
	}
	// Each SKU has one segment whose counter names the server as owner.
	for _, sku := range skus {
		resp, err := raw.Get(ctx(t), engines.Of(e.coord).Keys.SKUStock(sku)+"seg/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		owned := 0
		for _, kv := range resp.Kvs {
			if strings.Contains(string(kv.Value), `"owner"`) {
				owned++
			}
		}
		if owned != 1 {
			t.Fatalf("%s: %d of its counters name an owner, want 1", sku, owned)
		}
	}
	if _, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "tee-3", Order: "o-1", Qty: 1})); err != nil {
		t.Fatal(err)
	}
}

// NextExpiry over gRPC and JSON: none live, then the earliest deadline of
// two reservations; bad and unknown names are their reasons.
func TestNextExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "cap", Total: 10, Segments: 2, InitialFill: 10})
	next := func() *stockctlv1.NextExpiryResponse {
		t.Helper()
		res, err := c.NextExpiry(ctx(t), connect.NewRequest(&stockctlv1.NextExpiryRequest{Sku: "cap"}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg
	}
	if m := next(); m.Live || m.Deadline != nil {
		t.Fatalf("no reservation: %v", m)
	}
	var soon *stockctlv1.ReserveResponse
	for _, r := range []struct {
		order string
		ttl   time.Duration
	}{{"r-late", time.Hour}, {"r-soon", time.Minute}} {
		res, err := c.Reserve(ctx(t), connect.NewRequest(&stockctlv1.ReserveRequest{Sku: "cap", Order: r.order, Qty: 1, Ttl: durationpb.New(r.ttl)}))
		if err != nil {
			t.Fatal(err)
		}
		soon = res.Msg
	}
	if m := next(); !m.Live || !m.Deadline.AsTime().Equal(soon.Deadline.AsTime()) {
		t.Fatalf("two reservations: %v, want r-soon's deadline %v", m, soon.Deadline.AsTime())
	}
	code, _, body := post(t, e, "/stockctl.v1.StockService/NextExpiry", "application/json", "", []byte(`{"sku":"cap"}`))
	if code != http.StatusOK || !strings.Contains(string(body), `"live":true`) || !strings.Contains(string(body), soon.Deadline.AsTime().UTC().Format("2006-01-02T15:04:05")) {
		t.Fatalf("JSON NextExpiry: %d %s", code, body)
	}
	for _, tc := range []struct{ sku, reason, says string }{
		{"a b", "INVALID_ARGUMENT", `"a b"`},
		{"hoodie", "SKU_NOT_FOUND", "hoodie"},
	} {
		_, err := c.NextExpiry(ctx(t), connect.NewRequest(&stockctlv1.NextExpiryRequest{Sku: tc.sku}))
		if _, got := errorInfo(t, err); got != tc.reason || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("NextExpiry(%q) = %v (%s); want %s saying %s", tc.sku, err, got, tc.reason, tc.says)
		}
	}
}
