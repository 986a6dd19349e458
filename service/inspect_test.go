package service_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/testpki"
	"github.com/stockctl/stockctl/service"
)

func (e *env) inspect(t *testing.T) stockctlv1connect.InspectServiceClient {
	return stockctlv1connect.NewInspectServiceClient(httpClient(t, false, e.token()), e.url, connect.WithProtoJSON())
}

// ListLocks shows a lock held by another process with that process's
// identity, lease and the token its hold got; a waiter behind it; and a
// semaphore with its limit.
func TestInspectListLocks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withToken())
	other, err := coordinator.New(e.etcd.Client(t), coordinator.WithIdentity("other-proc"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	l, err := other.Lock(ctx(t), "nightly")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx(t))
	p, err := other.AcquirePermit(ctx(t), "pool-of-3", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Unlock(ctx(t))
	waiter, err := coordinator.New(e.etcd.Client(t), coordinator.WithIdentity("waiting-proc"))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	go func() {
		if w, err := waiter.Lock(t.Context(), "nightly"); err == nil {
			_ = w.Unlock(ctx(t))
		}
	}()
	var res *stockctlv1.ListLocksResponse
	waitFor(t, "the waiter to queue", func() bool {
		r, err := e.inspect(t).ListLocks(ctx(t), connect.NewRequest(&stockctlv1.ListLocksRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		res = r.Msg
		return len(res.Locks) == 2 && len(res.Locks[0].Waiters) == 1
	})
	lk, sem := res.Locks[0], res.Locks[1]
	if lk.Name != "nightly" || lk.Semaphore || len(lk.Holders) != 1 {
		t.Fatalf("lock listing %v", lk)
	}
	h := lk.Holders[0]
	if h.Identity != "other-proc" || h.Token != l.Token() || h.Kind != stockctlv1.LockKind_LOCK_KIND_EXCLUSIVE || h.Lease == "" {
		t.Errorf("holder %v, want identity other-proc and token %d", h, l.Token())
	}
	if w := lk.Waiters[0]; w.Identity != "waiting-proc" || w.Lease == h.Lease {
		t.Errorf("waiter %v", w)
	}
	if sem.Name != "pool-of-3" || !sem.Semaphore || sem.Limit != 3 || len(sem.Holders) != 1 || sem.Holders[0].Token != p.Token() {
		t.Errorf("semaphore listing %v", sem)
	}
	if res.Revision == 0 {
		t.Error("no revision")
	}
}

// GetCluster names the one member as leader, reads its database size and
// quota, and finds the compacted revision that a compaction set.
func TestInspectGetCluster(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.inspect(t)
	get := func() *stockctlv1.GetClusterResponse {
		r, err := c.GetCluster(ctx(t), connect.NewRequest(&stockctlv1.GetClusterRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg
	}
	first := get()
	if len(first.Members) != 1 || !first.Members[0].Leader || len(first.Endpoints) != 1 || first.Endpoints[0].DbSize == 0 || first.Endpoints[0].Error != "" {
		t.Fatalf("cluster %v", first)
	}
	if first.CompactRevision != 1 || first.Prefix != e.coord.Prefix() {
		t.Errorf("compact revision %d (want 1: nothing compacted), prefix %q", first.CompactRevision, first.Prefix)
	}
	client := e.etcd.Client(t)
	var rev int64
	for i := range 20 {
		r, err := client.Put(ctx(t), "/unrelated/"+strconv.Itoa(i), "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	if _, err := client.Compact(ctx(t), rev-5, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if got := get().CompactRevision; got != rev-5 {
		t.Errorf("compact revision %d after compacting at %d", got, rev-5)
	}
}

// GetOrderCounts counts this server's Allocate answers per SKU and
// outcome: a refusal for insufficient stock apart from other failures.
func TestInspectGetOrderCounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.grpcStock(t)
	createSKU(t, s, &stockctlv1.CreateSKURequest{Sku: "cap", Total: 3, Segments: 1, InitialFill: 3})
	for i := range 5 {
		_, _ = s.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "cap", Order: "o-" + strconv.Itoa(i), Qty: 1}))
	}
	_, _ = s.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "cap", Order: "bad/id", Qty: 1}))
	r, err := e.inspect(t).GetOrderCounts(ctx(t), connect.NewRequest(&stockctlv1.GetOrderCountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Msg.Skus) != 1 {
		t.Fatalf("counts %v", r.Msg.Skus)
	}
	if got := r.Msg.Skus[0]; got.Sku != "cap" || got.Ok != 3 || got.Refused != 2 || got.Failed != 1 {
		t.Errorf("counts %v, want 3 ok, 2 refused, 1 failed", got)
	}
}

// ListPlaceHolders names the process holding a segment's lock while it
// sells, and refuses an empty SKU.
func TestInspectListPlaceHolders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	seller, err := coordinator.New(e.etcd.Client(t), coordinator.WithIdentity("seller-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer seller.Close()
	if _, err := seller.CreateSKU(ctx(t), "mug", coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100}); err != nil {
		t.Fatal(err)
	}
	step := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := seller.AllocateFunc(t.Context(), "mug", "o-1", 1, "u", func(context.Context) error { <-step; return nil })
		done <- err
	}()
	c := e.inspect(t)
	waitFor(t, "seller-1 to show as a holder", func() bool {
		r, err := c.ListPlaceHolders(ctx(t), connect.NewRequest(&stockctlv1.ListPlaceHoldersRequest{Sku: "mug"}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range r.Msg.Places {
			if p.Identity == "seller-1" && strings.HasPrefix(p.Place, "seg/") && p.Lease != "" {
				return true
			}
		}
		return false
	})
	close(step)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_, err = c.ListPlaceHolders(ctx(t), connect.NewRequest(&stockctlv1.ListPlaceHoldersRequest{}))
	wantError(t, "no SKU", err, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
}

// The console's files are served without a token only with Config.Console,
// with headers that keep them from being framed or run scripts from
// elsewhere; the API beside them still needs the token.
func TestConsoleRoute(t *testing.T) {
	t.Parallel()
	on := newEnv(t, withToken(), withConfig(func(c *service.Config) { c.Console = true }))
	off := newEnv(t, withToken())
	client := &http.Client{Timeout: hangBound, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(url string) (*http.Response, string) {
		t.Helper()
		res, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	res, body := get(on.url + "/console/")
	if res.StatusCode != http.StatusOK || !strings.Contains(body, `<script type="module" src="console.js">`) {
		t.Fatalf("GET /console/: %d %.200s", res.StatusCode, body)
	}
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	for _, f := range []string{"console.js", "console.css"} {
		if res, _ := get(on.url + "/console/" + f); res.StatusCode != http.StatusOK {
			t.Errorf("GET /console/%s: %d", f, res.StatusCode)
		}
	}
	if res, _ := get(on.url + "/console"); res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/console/" {
		t.Errorf("GET /console: %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	if res, _ := get(on.url + "/console/?access_token=" + testToken); res.StatusCode != http.StatusBadRequest {
		t.Errorf("GET /console/ with a query: %d, want 400", res.StatusCode)
	}
	if res, _ := get(off.url + "/console/"); res.StatusCode == http.StatusOK {
		t.Errorf("GET /console/ without Config.Console: %d", res.StatusCode)
	}
	// The API beside the console still wants its token.
	req, _ := http.NewRequest(http.MethodPost, on.url+stockctlv1connect.InspectServiceGetClusterProcedure, strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	r, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusUnauthorized {
		t.Errorf("GetCluster without a token beside the console: HTTP %d", r.StatusCode)
	}
}

// The console is served on the API's listener, so with mutual TLS its page
// is HTTPS and a browser without a client certificate is refused at the
// handshake, as any API client is.
func TestConsoleRouteMutualTLS(t *testing.T) {
	t.Parallel()
	pki := testpki.New(t)
	cfg, err := service.LoadTLS(pki.ServerCert, pki.ServerKey, pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, withConfig(func(c *service.Config) { c.TLS, c.Console = cfg, true }))
	ca, err := os.ReadFile(pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	get := func(withCert bool) (*http.Response, error) {
		tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if withCert {
			cert, err := tls.LoadX509KeyPair(pki.ClientCert, pki.ClientKey)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
		defer tr.CloseIdleConnections()
		return (&http.Client{Transport: tr, Timeout: hangBound}).Get(e.url + "/console/")
	}
	if !strings.HasPrefix(e.url, "https://") {
		t.Fatalf("url %s", e.url)
	}
	res, err := get(true)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("GET /console/ with a client certificate: HTTP %d", res.StatusCode)
	}
	if res, err := get(false); err == nil {
		res.Body.Close()
		t.Errorf("GET /console/ without a client certificate: HTTP %d, want a refused handshake", res.StatusCode)
	}
}
