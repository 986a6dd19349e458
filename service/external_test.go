//go:build unix

package service_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// curl speaks Connect's JSON over HTTP/1.1: the way a PHP or shell caller
// uses the API.
func TestCurl(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl on PATH")
	}
	e := newEnv(t, withToken())
	curl := func(method, body string, auth bool) (int, map[string]any) {
		t.Helper()
		args := []string{"-sS", "--http1.1", "-X", "POST", "-H", "Content-Type: application/json", "-d", body,
			"-w", "\n%{http_code}", e.url + "/stockctl.v1.StockService/" + method}
		if auth {
			args = append(args, "-H", "Authorization: Bearer "+testToken)
		}
		out, err := run(t, "curl", args...)
		if err != nil {
			t.Fatalf("curl %s: %v: %s", method, err, out)
		}
		i := strings.LastIndexByte(out, '\n')
		var code int
		if _, err := fmt.Sscan(out[i+1:], &code); err != nil {
			t.Fatalf("curl %s: no status in %q", method, out)
		}
		var doc map[string]any
		if err := json.Unmarshal([]byte(out[:i]), &doc); err != nil {
			t.Fatalf("curl %s: %v: %s", method, err, out)
		}
		return code, doc
	}
	if code, doc := curl("CreateSKU", `{"sku":"mug","total":"3","segments":1,"initial_fill":3}`, true); code != 200 || doc["pool"] != "0" {
		t.Fatalf("CreateSKU: %d %v", code, doc)
	}
	code, first := curl("Allocate", `{"sku":"mug","order":"c-1","qty":2,"routeKey":"user-1"}`, true)
	if code != 200 || first["replayed"] != false || first["qty"] != "2" {
		t.Fatalf("Allocate: %d %v", code, first)
	}
	code, again := curl("Allocate", `{"sku":"mug","order":"c-1","qty":2,"route_key":"user-1"}`, true)
	if code != 200 || again["replayed"] != true || again["revision"] != first["revision"] {
		t.Fatalf("retried Allocate: %d %v, want %v replayed", code, again, first)
	}
	code, soldOut := curl("Allocate", `{"sku":"mug","order":"c-2","qty":5}`, true)
	if code != 400 || soldOut["code"] != "failed_precondition" || !strings.Contains(soldOut["message"].(string), "want 5, have 1") {
		t.Fatalf("sold out: %d %v", code, soldOut)
	}
	if code, doc := curl("Status", `{"sku":"mug"}`, false); code != 401 || doc["code"] != "unauthenticated" {
		t.Fatalf("without a token: %d %v", code, doc)
	}
	// A server stream over HTTP/1.1 is Connect's streaming protocol: each
	// message behind 5 bytes (flags, big-endian length). The stream lasts
	// until curl's --max-time ends it (exit 28).
	req := `{"sku":"mug","since":"0"}`
	body := filepath.Join(t.TempDir(), "watch-orders")
	if err := os.WriteFile(body, append([]byte{0, 0, 0, 0, byte(len(req))}, req...), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "curl", "-sS", "-N", "--http1.1", "--max-time", "2", "-X", "POST", "-H", "Content-Type: application/connect+json",
		"-H", "Authorization: Bearer "+testToken, "--data-binary", "@"+body, e.url+"/stockctl.v1.StockService/WatchOrders")
	if i := strings.IndexByte(out, '{'); err == nil || i != 5 || out[0] != 0 {
		t.Fatalf("curl WatchOrders: %v: %q, want a message frame first and curl's timeout", err, out)
	}
	n := int(out[1])<<24 | int(out[2])<<16 | int(out[3])<<8 | int(out[4])
	var batch struct {
		Events []map[string]any `json:"events"`
		Cursor string           `json:"cursor"`
	}
	if err := json.Unmarshal([]byte(out[5:5+n]), &batch); err != nil {
		t.Fatalf("curl WatchOrders: %v in %q", err, out)
	}
	if len(batch.Events) != 1 || batch.Events[0]["order"] != "c-1" || batch.Events[0]["event"] != "ORDER_EVENT_KIND_ALLOCATED" ||
		batch.Events[0]["revision"] != first["revision"] || batch.Cursor != first["revision"] {
		t.Fatalf("curl WatchOrders: first batch %+v, want c-1 allocated at revision %v", batch, first["revision"])
	}
}

// grpcurl finds the services by reflection and calls them over gRPC.
func TestGrpcurl(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: grpcurl may need building first")
	}
	grpcurl := grpcurlPath(t)
	e := newEnv(t, withToken())
	addr := strings.TrimPrefix(e.url, "http://")
	call := func(args ...string) (string, error) {
		return run(t, grpcurl, append([]string{"-plaintext", "-H", "authorization: Bearer " + testToken}, args...)...)
	}
	out, err := call(addr, "list")
	if err != nil || !strings.Contains(out, "stockctl.v1.StockService") || !strings.Contains(out, "stockctl.v1.LockService") || !strings.Contains(out, "grpc.health.v1.Health") {
		t.Fatalf("grpcurl list: %v: %s", err, out)
	}
	if out, err := call(addr, "describe", "stockctl.v1.AllocateRequest"); err != nil || !strings.Contains(out, "route_key") {
		t.Fatalf("grpcurl describe: %v: %s", err, out)
	}
	if out, err := call("-d", `{"sku":"pen","total":5,"segments":2,"initial_fill":5}`, addr, "stockctl.v1.StockService/CreateSKU"); err != nil {
		t.Fatalf("CreateSKU: %v: %s", err, out)
	}
	out, err = call("-d", `{"sku":"pen","order":"g-1","qty":2}`, addr, "stockctl.v1.StockService/Allocate")
	if err != nil || !strings.Contains(out, `"parts"`) || !strings.Contains(out, `"seg/`) {
		t.Fatalf("Allocate: %v: %s", err, out)
	}
	out, err = call("-d", `{"sku":"pen","order":"g-2","qty":9}`, addr, "stockctl.v1.StockService/Allocate")
	if err == nil || !strings.Contains(out, "FailedPrecondition") || !strings.Contains(out, "INSUFFICIENT_STOCK") {
		t.Fatalf("sold out through grpcurl: %v: %s", err, out)
	}
	// The stream lasts until -max-time. grpcurl sends it as the call's
	// deadline, so whichever side sees it first ends the stream: the
	// server with OK, or grpcurl with DeadlineExceeded.
	out, err = call("-max-time", "2", "-d", `{"sku":"pen"}`, addr, "stockctl.v1.StockService/WatchOrders")
	if !strings.Contains(out, `"ORDER_EVENT_KIND_ALLOCATED"`) || !strings.Contains(out, `"order": "g-1"`) || !strings.Contains(out, `"cursor"`) ||
		strings.Count(out, `"revision"`) != 1 || (err != nil) != strings.Contains(out, "DeadlineExceeded") {
		t.Fatalf("WatchOrders through grpcurl: %v: %s", err, out)
	}
	// Health needs no token (reflection does: -reflect-header sends it
	// with the reflection requests only).
	if out, err := run(t, grpcurl, "-plaintext", "-reflect-header", "authorization: Bearer "+testToken, addr, "grpc.health.v1.Health/Check"); err != nil || !strings.Contains(out, "SERVING") {
		t.Fatalf("health: %v: %s", err, out)
	}
}

// Python's grpcio, with stubs generated now from the committed proto:
// stock calls, an idempotent retry, a refusal's typed details, both lock
// shapes, and a missing token.
func TestPythonClient(t *testing.T) {
	t.Parallel()
	python := pythonWithGRPC(t)
	e := newEnv(t, withToken())
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rpcstatus.proto"), []byte(rpcStatusProto), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "client.py"), []byte(pythonClient), 0o644); err != nil {
		t.Fatal(err)
	}
	protos, err := filepath.Glob("../api/stockctl/v1/*.proto")
	if err != nil || len(protos) == 0 {
		t.Fatalf("no proto files: %v", err)
	}
	args := []string{"-m", "grpc_tools.protoc", "-I", "../api", "-I", dir, "--python_out=" + dir, "--grpc_python_out=" + dir, filepath.Join(dir, "rpcstatus.proto")}
	for _, p := range protos {
		args = append(args, strings.TrimPrefix(p, "../api/"))
	}
	if out, err := run(t, python, args...); err != nil {
		t.Fatalf("grpc_tools.protoc: %v: %s", err, out)
	}
	out, err := run(t, python, filepath.Join(dir, "client.py"), strings.TrimPrefix(e.url, "http://"), testToken)
	if err != nil || !strings.Contains(out, "python client: ok") {
		t.Fatalf("python client: %v:\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(out))
}

// rpcStatusProto is the part of google/rpc/status.proto and
// error_details.proto the Python client reads, under a package of its own
// (Debian's "google" Python package would hide a generated google.rpc);
// the wire format is the same.
const rpcStatusProto = `syntax = "proto3";
package stockctltest;
import "google/protobuf/any.proto";
message Status { int32 code = 1; string message = 2; repeated google.protobuf.Any details = 3; }
message ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }
`

const pythonClient = `import queue
import sys

import grpc
from google.protobuf import duration_pb2

import rpcstatus_pb2
from stockctl.v1 import errors_pb2, lock_service_pb2 as lk, lock_service_pb2_grpc as lkg
from stockctl.v1 import stock_service_pb2 as st, stock_service_pb2_grpc as stg

target, token = sys.argv[1], sys.argv[2]
md = [("authorization", "Bearer " + token)]
channel = grpc.insecure_channel(target)
stock = stg.StockServiceStub(channel)

stock.CreateSKU(st.CreateSKURequest(sku="py", total=3, segments=1, initial_fill=3), metadata=md, timeout=30)
first = stock.Allocate(st.AllocateRequest(sku="py", order="py-1", qty=2, route_key="u-1"), metadata=md, timeout=30)
assert not first.replayed and first.qty == 2 and first.parts[0].place == "seg/0", first
again = stock.Allocate(st.AllocateRequest(sku="py", order="py-1", qty=2, route_key="u-1"), metadata=md, timeout=30)
assert again.replayed and again.revision == first.revision, again

try:
    stock.Allocate(st.AllocateRequest(sku="py", order="py-2", qty=5), metadata=md, timeout=30)
    raise SystemExit("sold out: no error")
except grpc.RpcError as err:
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
    status = rpcstatus_pb2.Status.FromString(dict(err.trailing_metadata())["grpc-status-details-bin"])
    kinds = {d.type_url.rsplit("/", 1)[-1]: d.value for d in status.details}
    info = rpcstatus_pb2.ErrorInfo.FromString(kinds["google.rpc.ErrorInfo"])
    assert info.reason == "INSUFFICIENT_STOCK" and info.domain == "stockctl", info
    refusal = errors_pb2.InsufficientStock.FromString(kinds["stockctl.v1.InsufficientStock"])
    assert refusal.want == 5 and refusal.remaining == 1 and refusal.revision > 0, refusal

try:
    stock.Status(st.StatusRequest(sku="py"), timeout=30)
    raise SystemExit("no token: no error")
except grpc.RpcError as err:
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED, err

locks = lkg.LockServiceStub(channel)
outbox = queue.Queue()
def requests():
    yield lk.HoldRequest(acquire=lk.HoldAcquire(name="py-lock", ttl=duration_pb2.Duration(seconds=30)))
    while True:
        m = outbox.get()
        if m is None:
            return
        yield m
events = locks.Hold(requests(), metadata=md, timeout=30)
got = next(events)
assert got.WhichOneof("event") == "acquired", got
stream_token = got.acquired.token
outbox.put(lk.HoldRequest(keep_alive=lk.HoldKeepAlive()))
outbox.put(lk.HoldRequest(release=lk.HoldRelease()))
got = next(events)
assert got.WhichOneof("event") == "released" and got.released.token == stream_token, got
outbox.put(None)

held = locks.Acquire(lk.AcquireRequest(name="py-lock", ttl=duration_pb2.Duration(seconds=10)), metadata=md, timeout=30)
assert held.token > stream_token, (held.token, stream_token)
locks.KeepAlive(lk.KeepAliveRequest(hold_id=held.hold_id), metadata=md, timeout=30)
locks.Release(lk.LockServiceReleaseRequest(hold_id=held.hold_id), metadata=md, timeout=30)

left = stock.Status(st.StatusRequest(sku="py"), metadata=md, timeout=30).status
assert left.remaining == 1 and left.allocated == 2, left
print("python client: ok (grpcio %s; lock tokens %d then %d)" % (grpc.__version__, stream_token, held.token))
`
