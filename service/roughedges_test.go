package service_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/client/v3/concurrency"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/internal/keys"
)

// A request without a content type the server speaks gets 415 with a body
// that says which it accepts (it was empty).
func TestUnsupportedContentTypeSaysWhatIsAccepted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, ct := range []string{"", "text/plain", "application/xml"} {
		t.Run("content type "+ct, func(t *testing.T) {
			code, we, raw := post(t, e, "/stockctl.v1.StockService/Status", ct, "", []byte(`{"sku":"x"}`))
			if code != http.StatusUnsupportedMediaType {
				t.Fatalf("status %d, want 415", code)
			}
			if we.Code != "invalid_argument" || !strings.Contains(we.Message, "application/json") || !strings.Contains(we.Message, "application/grpc") {
				t.Fatalf("body %q, want a JSON error naming the accepted types", raw)
			}
			if ct != "" && !strings.Contains(we.Message, ct) {
				t.Fatalf("body %q does not name the type sent, %q", raw, ct)
			}
		})
	}
}

// Non-ASCII input is refused with a message that quotes it as UTF-8
// (before: "byte 1 ('Ã') is not a letter…"), naming the field and the
// character; nothing is created or changed. Unicode SKUs are not allowed.
func TestNonASCIIInputQuotedAsUTF8(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createSKU(t, e.grpcStock(t), &stockctlv1.CreateSKURequest{Sku: "phone", Total: 10, Segments: 1, InitialFill: 10})
	for _, tc := range []struct {
		name, path, body, field, value string
	}{
		{"CreateSKU sku", "/stockctl.v1.StockService/CreateSKU", `{"sku":"téléphone","total":10,"segments":1}`, "sku", "téléphone"},
		{"Allocate sku", "/stockctl.v1.StockService/Allocate", `{"sku":"téléphone","order":"o-1","qty":1}`, "sku", "téléphone"},
		{"Allocate order", "/stockctl.v1.StockService/Allocate", `{"sku":"phone","order":"commande-é","qty":1}`, "order", "commande-é"},
		{"Reserve buyer", "/stockctl.v1.StockService/Reserve", `{"sku":"phone","order":"o-2","qty":1,"buyer":"zoë","ttl":"60s"}`, "buyer", "zoë"},
		{"Restock delivery", "/stockctl.v1.StockService/Restock", `{"sku":"phone","qty":1,"delivery":"bon-№7"}`, "delivery", "bon-№7"},
		{"Status sku", "/stockctl.v1.StockService/Status", `{"sku":"téléphone"}`, "sku", "téléphone"},
		{"Acquire name", "/stockctl.v1.LockService/Acquire", `{"name":"verrou-é","wait":"0s"}`, "name", "verrou-é"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, we, raw := post(t, e, tc.path, "application/json", "", []byte(tc.body))
			if code != http.StatusBadRequest || reasonOf(we) != "INVALID_ARGUMENT" {
				t.Fatalf("%d %s, want 400 INVALID_ARGUMENT", code, raw)
			}
			if !utf8.Valid(raw) || strings.Contains(we.Message, "Ã") || strings.Contains(we.Message, "â") ||
				!strings.Contains(we.Message, tc.field) || !strings.Contains(we.Message, `"`+tc.value+`"`) || !strings.Contains(we.Message, "non-ASCII character") {
				t.Fatalf("message %q: want the %s field and %q quoted as UTF-8, no mojibake", we.Message, tc.field, tc.value)
			}
		})
	}
	// Nothing changed.
	if st := status(t, e.grpcStock(t), "phone"); st.Orders != 0 || st.Total != 10 {
		t.Fatalf("status after the refusals: %v", st)
	}
	res, err := e.grpcStock(t).ListSKUs(ctx(t), connect.NewRequest(&stockctlv1.ListSKUsRequest{}))
	if err != nil || len(res.Msg.Skus) != 1 {
		t.Fatalf("ListSKUs = %v, %v; want only phone", res, err)
	}
	// Through OrderStream and WatchOrders too.
	got := orderStream(t, e.grpcStock(t), []*stockctlv1.OrderStreamRequest{{Id: 1, Order: &stockctlv1.OrderStreamRequest_Allocate{
		Allocate: &stockctlv1.AllocateRequest{Sku: "phone", Order: "commande-é", Qty: 1}}}})
	if oe := got[1].GetError(); oe == nil || oe.Reason != stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT || !strings.Contains(oe.Message, `"commande-é"`) {
		t.Fatalf("OrderStream: %v", got[1])
	}
	err = receiveError(t, e.grpcStock(t), &stockctlv1.WatchOrdersRequest{Sku: "téléphone"})
	if !strings.Contains(err.Error(), "non-ASCII character 'é'") || connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("WatchOrders: %v", err)
	}
}

// Status names the rebalancer elected now (rebalancer_leader), which the
// last pass's leader is not once that process is gone.
func TestStatusNamesTheElectedRebalancer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "phone", Total: 10, Segments: 1})
	if st := status(t, c, "phone"); st.RebalancerLeader != "" {
		t.Fatalf("leader %q before any election", st.RebalancerLeader)
	}
	ks, err := keys.New(e.coord.Prefix())
	if err != nil {
		t.Fatal(err)
	}
	sess, err := concurrency.NewSession(e.etcd.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, ks.Election())
	if err := el.Campaign(ctx(t), "serve-b"); err != nil {
		t.Fatal(err)
	}
	if st := status(t, c, "phone"); st.RebalancerLeader != "serve-b" {
		t.Fatalf("leader %q, want serve-b", st.RebalancerLeader)
	}
	b, _ := json.Marshal(map[string]string{"sku": "phone"})
	_, _, raw := post(t, e, "/stockctl.v1.StockService/Status", "application/json", "", b)
	if !strings.Contains(string(raw), `"rebalancerLeader":"serve-b"`) {
		t.Fatalf("JSON status %s lacks rebalancerLeader", raw)
	}
	if err := el.Resign(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if st := status(t, c, "phone"); st.RebalancerLeader != "" {
		t.Fatalf("leader %q after the resignation", st.RebalancerLeader)
	}
}
