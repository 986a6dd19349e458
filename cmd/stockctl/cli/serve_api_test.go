package cli

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	connectrpc "connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/internal/testpki"
)

// A real `stockctl serve` process on its embedded etcd answers every
// StockService method (and a unary lock) with curl, JSON over HTTP/1.1;
// SIGTERM stops it with exit 0, and what it sold is in its data dir.
func TestServeProcessEveryStockMethod(t *testing.T) {
	t.Parallel()
	needCurl(t)
	dir := filepath.Join(t.TempDir(), "api.etcd")
	p := startServeProc(t, "--data-dir", dir, "serve", "--listen", freeAddr(t), "--api-addr", "127.0.0.1:0", "--identity", "api-every")
	if !strings.HasPrefix(p.view.API, "http://127.0.0.1:") || p.view.DataDir != dir || len(p.view.Endpoints) != 1 {
		t.Fatalf("serve's first line: %+v", p.view)
	}
	call := func(method, body string) map[string]any {
		t.Helper()
		code, doc := curlCall(t, p.view.API, method, "", body)
		if code != http.StatusOK {
			t.Fatalf("%s %s: HTTP %d %v", method, body, code, doc)
		}
		return doc
	}
	stock := func(m string) string { return "stockctl.v1.StockService/" + m }

	call(stock("CreateSKU"), `{"sku":"tee","total":100,"segments":2,"initial_fill":40,"low_watermark":2,"refill_batch":10}`)
	first := call(stock("Allocate"), `{"sku":"tee","order":"o-1","qty":2,"route_key":"user-1"}`)
	again := call(stock("Allocate"), `{"sku":"tee","order":"o-1","qty":2,"route_key":"user-1"}`)
	if first["replayed"] != false || again["replayed"] != true || again["revision"] != first["revision"] {
		t.Fatalf("allocate then its retry: %v / %v", first, again)
	}
	if r := call(stock("Reserve"), `{"sku":"tee","order":"r-1","qty":1,"ttl":"900s","buyer":"amy"}`); r["state"] != "ORDER_STATE_RESERVED" {
		t.Fatalf("reserve: %v", r)
	}
	call(stock("Confirm"), `{"sku":"tee","order":"r-1"}`)
	call(stock("Reserve"), `{"sku":"tee","order":"r-2","qty":3,"ttl":"600s"}`)
	if r := call(stock("Cancel"), `{"sku":"tee","order":"r-2"}`); r["qty"] != "3" {
		t.Fatalf("cancel: %v", r)
	}
	if r := call(stock("Release"), `{"sku":"tee","order":"o-1"}`); r["qty"] != "2" || r["replayed"] != false {
		t.Fatalf("release: %v", r)
	}
	if r := call(stock("Restock"), `{"sku":"tee","qty":10,"delivery":"dn-1"}`); r["total"] != "110" {
		t.Fatalf("restock: %v", r)
	}
	st := call(stock("Status"), `{"sku":"tee"}`)["status"].(map[string]any)
	if st["total"] != "110" || st["allocated"] != "1" {
		t.Fatalf("status: %v", st)
	}
	if a := call(stock("Audit"), `{"sku":"tee"}`); a["ok"] != true || a["allocated"] != "1" || a["total"] != "110" {
		t.Fatalf("audit: %v", a)
	}
	if frame := watchFrame(t, p.view.API, `{"sku":"tee"}`); frame["status"].(map[string]any)["total"] != "110" {
		t.Fatalf("WatchStatus's first frame: %v", frame)
	}
	hold := call("stockctl.v1.LockService/Acquire", `{"name":"nightly","ttl":"30s","wait":"10s"}`)
	if r := call("stockctl.v1.LockService/Release", fmt.Sprintf(`{"hold_id":%q}`, hold["holdId"])); r["token"] != hold["token"] {
		t.Fatalf("lock release %v after acquire %v", r, hold)
	}

	if code := p.term(); code != 0 {
		t.Fatalf("serve exited %d on SIGTERM; stderr:\n%s", code, p.errOut.String())
	}
	if !strings.Contains(p.errOut.String(), "api: shutting down") {
		t.Errorf("serve's stderr does not say the API shut down:\n%s", p.errOut.String())
	}
	var au auditView
	decode(t, run(t, "--data-dir", dir, "-o", "json", "audit", "tee").stdout, &au)
	if !au.OK || au.Allocated != 1 || au.Total != 110 {
		t.Fatalf("audit of the data dir after serve: %+v", au)
	}
}

// watchFrame reads the first message of a WatchStatus stream with curl,
// in Connect's streaming protocol (each message framed by a flag byte and
// a big-endian length), with a deadline the server ends the stream at.
func watchFrame(t *testing.T, api, body string) map[string]any {
	t.Helper()
	frame := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(body)))
	frame = append(frame, body...)
	cmd := exec.Command("curl", "-sS", "-N", "--max-time", strconv.Itoa(int(procBound.Seconds())), "-X", "POST",
		"-H", "Content-Type: application/connect+json", "-H", "Connect-Timeout-Ms: 1000", "--data-binary", "@-",
		api+"/stockctl.v1.StockService/WatchStatus")
	cmd.Stdin = bytes.NewReader(frame)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl WatchStatus: %v: %q", err, out)
	}
	if len(out) < 5 || out[0] != 0 || int(binary.BigEndian.Uint32(out[1:5])) > len(out)-5 {
		t.Fatalf("WatchStatus: no message frame first in %q", out)
	}
	var doc map[string]any
	if err := json.Unmarshal(out[5:5+binary.BigEndian.Uint32(out[1:5])], &doc); err != nil {
		t.Fatalf("WatchStatus's first frame: %v in %q", err, out)
	}
	return doc
}

// An order retried through another serve process (another coordinator on
// the same etcd, with --endpoints) returns the first outcome and deducts
// nothing; gRPC over cleartext HTTP/2 on loopback.
func TestServeProcessRetryThroughAnother(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := startServeProc(t, e.args("serve", "--api-addr", "127.0.0.1:0", "--identity", "retry-a")...)
	b := startServeProc(t, e.args("serve", "--api-addr", "127.0.0.1:0", "--identity", "retry-b")...)
	if a.view.DataDir != "" || strings.Join(a.view.Endpoints, ",") != shared.endpoints || a.view.Prefix != e.prefix {
		t.Fatalf("serve --endpoints says %+v", a.view)
	}
	ca := stockctlv1connect.NewStockServiceClient(h2cClient(t), a.view.API, connectrpc.WithGRPC())
	cb := stockctlv1connect.NewStockServiceClient(h2cClient(t), b.view.API, connectrpc.WithGRPC())
	ctx := t.Context()
	if _, err := ca.CreateSKU(ctx, connectrpc.NewRequest(&stockctlv1.CreateSKURequest{Sku: "shoe", Total: 100, Segments: 4, InitialFill: 40})); err != nil {
		t.Fatal(err)
	}
	req := &stockctlv1.AllocateRequest{Sku: "shoe", Order: "o-1", Qty: 3, RouteKey: "u-1"}
	first, err := ca.Allocate(ctx, connectrpc.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	retry, err := cb.Allocate(ctx, connectrpc.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if first.Msg.Replayed || !retry.Msg.Replayed || retry.Msg.Revision != first.Msg.Revision || fmt.Sprint(retry.Msg.Parts) != fmt.Sprint(first.Msg.Parts) {
		t.Fatalf("retry through B = %v, want A's outcome %v replayed", retry.Msg, first.Msg)
	}
	au, err := cb.Audit(ctx, connectrpc.NewRequest(&stockctlv1.AuditRequest{Sku: "shoe"}))
	if err != nil || !au.Msg.Ok || au.Msg.Allocated != 3 || au.Msg.Orders != 1 {
		t.Fatalf("audit after the retry: %v %v", au, err)
	}
}

// h2cClient speaks HTTP/2 without TLS (gRPC on loopback).
func h2cClient(t *testing.T) *http.Client {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// serve refuses an API beyond loopback without TLS and client
// authentication: exit 2, naming what is missing in terms of its flags,
// before it starts anything (no data dir, nothing listening).
func TestServeProcessRefusesPublicAddress(t *testing.T) {
	t.Parallel()
	pki := testpki.New(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("# the test's\nrefuse-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		flags []string
		want  []string
		not   []string
	}{
		{"nothing", []string{"--api-addr", "0.0.0.0:0"}, []string{"no TLS", "nor client authentication", "--api-cert and --api-key", "--api-tokens or --api-client-ca"}, nil},
		{"wildcard port only", []string{"--api-addr", ":7070", "--api-tokens", tokens}, []string{"no TLS", "--api-cert and --api-key"},
			[]string{"nor client authentication", "--api-tokens or", "refuse-token"}},
		{"tls without auth", []string{"--api-addr", "0.0.0.0:0", "--api-cert", pki.ServerCert, "--api-key", pki.ServerKey},
			[]string{"no client authentication", "--api-tokens or --api-client-ca"}, []string{"--api-cert and"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "never.etcd")
			cmd := exec.Command(stockctlBinary(t), append([]string{"--data-dir", dir, "serve", "--listen", freeAddr(t)}, tc.flags...)...)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != ExitUsage {
				t.Fatalf("serve %v: %v, want exit %d; stderr %q", tc.flags, err, ExitUsage, errOut.String())
			}
			msg := errOut.String()
			for _, w := range append(tc.want, "stockctl: refusing --api-addr") {
				if !strings.Contains(msg, w) {
					t.Errorf("stderr %q does not say %q", msg, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(msg, n) {
					t.Errorf("stderr %q says %q", msg, n)
				}
			}
			if out.Len() != 0 {
				t.Errorf("stdout %q, want nothing", out.String())
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a refused serve started the embedded etcd: %s exists (%v)", dir, err)
			}
		})
	}
	// --listen is the embedded etcd's: beyond loopback it is refused too.
	args := []string{"--data-dir", filepath.Join(t.TempDir(), "x.etcd"), "serve", "--listen", "0.0.0.0:2379", "--api-addr", "127.0.0.1:0"}
	checkFails(t, run(t, args...), ExitUsage, "must be a loopback address", args)
}

// serve with --api-tokens (and TLS on loopback) answers 401 without a
// token or with a wrong one, serves with the right one, answers health
// checks without one, and never prints a token, right or wrong.
func TestServeProcessTokens(t *testing.T) {
	t.Parallel()
	needCurl(t)
	const token, wrong = "served-token-0123456789abcdef", "wrong-token-0123456789abcdef"
	pki := testpki.New(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	p := startServeProc(t, e.args("serve", "--api-addr", "127.0.0.1:0", "--api-tokens", tokens,
		"--api-cert", pki.ServerCert, "--api-key", pki.ServerKey, "--metrics-addr", "127.0.0.1:0")...)
	if !strings.HasPrefix(p.view.API, "https://127.0.0.1:") {
		t.Fatalf("API at %q, want https", p.view.API)
	}
	for _, tc := range []struct {
		name, token string
		code        int
		want        string
	}{
		{"no token", "", http.StatusUnauthorized, "unauthenticated"},
		{"wrong token", wrong, http.StatusUnauthorized, "unauthenticated"},
		{"the token", token, http.StatusNotFound, "not_found"}, // past authentication: no such SKU
	} {
		code, doc := curlCall(t, p.view.API, "stockctl.v1.StockService/Status", tc.token, `{"sku":"none"}`, "--cacert", pki.CA)
		if code != tc.code || doc["code"] != tc.want {
			t.Errorf("%s: HTTP %d %v, want %d %s", tc.name, code, doc, tc.code, tc.want)
		}
	}
	m := metricsLine.FindStringSubmatch(p.errOut.String())
	if m == nil {
		t.Fatalf("serve did not say where its metrics are:\n%s", p.errOut.String())
	}
	fams := scrape(t, m[1])
	if v, ok := sample(fams, "stockctl_api_rejected_total", map[string]string{"reason": "token_invalid"}); !ok || v != 1 {
		t.Errorf("stockctl_api_rejected_total{reason=token_invalid} = %v (found %v), want 1", v, ok)
	}
	if v, ok := sample(fams, "stockctl_api_request_duration_seconds", map[string]string{"method": "stockctl.v1.StockService/Status", "code": "not_found"}); !ok || v != 1 {
		t.Errorf("Status calls answered not_found: %v (found %v), want 1", v, ok)
	}
	if code := p.term(); code != 0 {
		t.Fatalf("serve exited %d on SIGTERM; stderr:\n%s", code, p.errOut.String())
	}
	for _, s := range []string{p.out.String(), p.errOut.String()} {
		if strings.Contains(s, token) || strings.Contains(s, wrong) {
			t.Fatalf("serve printed a token:\n%s", s)
		}
	}
}
