package service_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/service"
)

// wireError is the JSON body of a Connect error.
type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type  string          `json:"type"`
		Debug json.RawMessage `json:"debug"`
	} `json:"details"`
}

// post sends body to path over HTTP/1.1 as a curl would, and returns the
// status and the decoded error (if the body is one).
func post(t *testing.T, e *env, path, contentType, auth string, body []byte) (int, wireError, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, e.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	res, err := httpClient(t, false, "").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var we wireError
	_ = json.Unmarshal(raw, &we)
	return res.StatusCode, we, raw
}

// reasonOf is the ErrorInfo reason of a JSON error, from its debug form.
func reasonOf(we wireError) string {
	for _, d := range we.Details {
		if d.Type == "google.rpc.ErrorInfo" {
			var info struct {
				Reason string `json:"reason"`
			}
			_ = json.Unmarshal(d.Debug, &info)
			return info.Reason
		}
	}
	return ""
}

const allocatePath = "/stockctl.v1.StockService/Allocate"

// Malformed requests over plain HTTP get a clear error and change nothing.
func TestHTTPMalformedRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(c *service.Config) { c.MaxBodyBytes = 4 << 10 }))
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "cam", Total: 10, Segments: 2, InitialFill: 10})
	before := status(t, c, "cam")

	huge := []byte(`{"sku":"cam","order":"o-huge","qty":1,"routeKey":"` + strings.Repeat("x", 64<<10) + `"}`)
	for _, tc := range []struct {
		name, ctype string
		body        []byte
		status      int
		code        string
		reason      string
		msg         string
	}{
		{"bad json", "application/json", []byte(`{"sku":"cam",`), 400, "invalid_argument", "", "unmarshal"},
		{"unknown field", "application/json", []byte(`{"sku":"cam","order":"o-1","qty":1,"colour":"red"}`), 400, "invalid_argument", "", "unknown field"},
		{"wrong type", "application/json", []byte(`{"sku":"cam","order":"o-1","qty":"lots"}`), 400, "invalid_argument", "", "qty"},
		{"huge body", "application/json", huge, 429, "resource_exhausted", "BODY_TOO_LARGE", "larger than"},
		{"wrong content type", "text/plain", []byte(`sku=cam`), 415, "invalid_argument", "", "it accepts: application/grpc"},
		{"qty 0", "application/json", []byte(`{"sku":"cam","order":"o-1","qty":0}`), 400, "invalid_argument", "INVALID_ARGUMENT", "qty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, we, raw := post(t, e, allocatePath, tc.ctype, "", tc.body)
			if st != tc.status || we.Code != tc.code || reasonOf(we) != tc.reason || !strings.Contains(we.Message, tc.msg) {
				t.Fatalf("status %d, body %s; want %d %q %q containing %q", st, raw, tc.status, tc.code, tc.reason, tc.msg)
			}
		})
	}
	after := status(t, c, "cam")
	if after.Orders != before.Orders || after.Remaining != before.Remaining {
		t.Fatalf("malformed requests changed the stock: %v → %v", before, after)
	}
	audit(t, c, "cam")
}

// Bearer tokens: none, a wrong one, one in the URL; health needs none.
func TestHTTPAuthentication(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withToken())
	body := []byte(`{"sku":"cam"}`)
	const statusPath = "/stockctl.v1.StockService/Status"
	for _, tc := range []struct {
		name, path, auth string
		status           int
		reason           string
	}{
		{"no token", statusPath, "", 401, "TOKEN_MISSING"},
		{"wrong token", statusPath, "Bearer wrong-token-0123456789", 401, "TOKEN_INVALID"},
		{"not bearer", statusPath, "Basic " + testToken, 401, "TOKEN_INVALID"},
		{"token in the URL", statusPath + "?access_token=" + testToken, "", 400, "TOKEN_IN_URL"},
		{"token in the URL under another name", statusPath + "?x=" + testToken, "Bearer " + testToken, 400, "TOKEN_IN_URL"},
		{"right token", statusPath, "Bearer " + testToken, 404, "SKU_NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, we, raw := post(t, e, tc.path, "application/json", tc.auth, body)
			if st != tc.status || reasonOf(we) != tc.reason {
				t.Fatalf("status %d, body %s; want %d %s", st, raw, tc.status, tc.reason)
			}
			if strings.Contains(string(raw), testToken) {
				t.Fatalf("the token appears in the answer: %s", raw)
			}
		})
	}

	// gRPC callers are refused the same way.
	_, err := stockctlv1connect.NewStockServiceClient(httpClient(t, true, ""), e.url, connect.WithGRPC()).
		Status(ctx(t), connect.NewRequest(&stockctlv1.StatusRequest{Sku: "cam"}))
	wantError(t, "gRPC without a token", err, connect.CodeUnauthenticated, stockctlv1.ErrorReason_ERROR_REASON_TOKEN_MISSING)

	// Health answers without a token, for load balancers.
	hc := grpchealth.NewClient(httpClient(t, true, ""), e.url, connect.WithGRPC())
	res, err := hc.Check(ctx(t), &grpchealth.CheckRequest{})
	if err != nil || res.Status != grpchealth.StatusServing {
		t.Fatalf("health without a token: %v, %v", res, err)
	}
	if _, err := hc.Check(ctx(t), &grpchealth.CheckRequest{Service: "no.such.Service"}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("health of an unknown service: %v, want not_found", err)
	}

	// Nothing of the token in the metrics.
	fams, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if strings.Contains(f.String(), testToken) {
			t.Fatalf("metric %s holds the token", f.GetName())
		}
	}
}
