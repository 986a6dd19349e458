package service_test

import (
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
)

// Small answers go out uncompressed even to a client that accepts gzip
// (compressing a hundred bytes costs CPU and saves nothing), and so do
// answers of a few KiB (an OrderStream message of tens of answers: gzip
// was 5 % of a serve process's CPU at 1 KiB); large ones (a Status of
// hundreds of segments) are compressed.
func TestCompressOnlyLargeAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createSKU(t, e.grpcStock(t), &stockctlv1.CreateSKURequest{Sku: "wide", Total: 100_000, Segments: 512, InitialFill: 100_000})
	createSKU(t, e.grpcStock(t), &stockctlv1.CreateSKURequest{Sku: "mid", Total: 100_000, Segments: 24, InitialFill: 100_000})
	encoding := func(method, body string) string {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, e.url+"/stockctl.v1.StockService/"+method, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept-Encoding", "gzip") // set by hand: the transport does not decompress
		res, err := httpClient(t, false, "").Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var r io.Reader = res.Body
		if res.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(res.Body)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		n, err := io.Copy(io.Discard, r) // the answer's own size
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("%s: HTTP %d, %v", method, res.StatusCode, err)
		}
		t.Logf("%s %s: %d bytes, Content-Encoding %q", method, body, n, res.Header.Get("Content-Encoding"))
		if body == `{"sku":"mid"}` && (n <= 1024 || n >= 16*1024) {
			t.Errorf("a Status of 24 segments is %d bytes: not between 1 and 16 KiB, so not the case it stands for", n)
		}
		return res.Header.Get("Content-Encoding")
	}
	if enc := encoding("Allocate", `{"sku":"wide","order":"o-1","qty":1}`); enc != "" {
		t.Errorf("an Allocate answer went out with Content-Encoding %q", enc)
	}
	if enc := encoding("Status", `{"sku":"mid"}`); enc != "" {
		t.Errorf("a Status of 24 segments went out with Content-Encoding %q", enc)
	}
	if enc := encoding("Status", `{"sku":"wide"}`); enc != "gzip" {
		t.Errorf("a Status of 512 segments went out with Content-Encoding %q, want gzip", enc)
	}
}
