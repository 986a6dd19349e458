package service_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/proto"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/service"
)

// TestMain fails the package if any goroutine outlives the tests: every
// server, stream, hold keeper, coordinator and embedded etcd must end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testToken is the bearer token of servers started with withToken.
const testToken = "test-token-0123456789abcdef"

// hangBound bounds every wait of these tests: long enough for a loaded
// machine, only there to turn a hang into a failure.
const hangBound = 60 * time.Second

// env is a real server on loopback in front of a real coordinator on an
// embedded etcd.
type env struct {
	etcd  *etcdtest.Single
	coord *coordinator.Coordinator
	srv   *service.Server
	reg   *prometheus.Registry
	url   string // http://127.0.0.1:port
	cfg   service.Config
}

type envOption func(*envSetup)

type envSetup struct {
	cfg       service.Config
	coordOpts []coordinator.Option
	etcd      *etcdtest.Single
}

func withConfig(f func(*service.Config)) envOption { return func(s *envSetup) { f(&s.cfg) } }
func withToken() envOption {
	return withConfig(func(c *service.Config) { c.Tokens = []string{testToken} })
}
func withCoordOptions(o ...coordinator.Option) envOption {
	return func(s *envSetup) { s.coordOpts = append(s.coordOpts, o...) }
}

// onEtcd runs the server on an etcd another env already uses, with a
// coordinator of its own: a second process sharing the stock.
func onEtcd(e *etcdtest.Single) envOption { return func(s *envSetup) { s.etcd = e } }

// newEnv starts etcd (unless onEtcd), a coordinator and a served Server.
// Everything is stopped at cleanup, the server first.
func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	var setup envSetup
	for _, o := range opts {
		o(&setup)
	}
	e := &env{etcd: setup.etcd, reg: prometheus.NewRegistry()}
	if e.etcd == nil {
		e.etcd = etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	}
	client := e.etcd.Client(t)
	coord, err := coordinator.New(client, setup.coordOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.Close() })
	e.coord = coord
	cfg := setup.cfg
	cfg.Registerer = e.reg
	srv, err := service.New(coord, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv, e.cfg = srv, cfg
	e.url = serve(t, srv, cfg.TLS)
	return e
}

// serve serves srv on a fresh loopback port until cleanup and returns its
// base URL.
func serve(t *testing.T, srv *service.Server, tlsCfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(hangBound):
			t.Errorf("Serve did not return %v after its ctx ended", hangBound)
		}
		_ = srv.Close()
	})
	scheme := "http://"
	if tlsCfg != nil {
		scheme = "https://"
	}
	return scheme + ln.Addr().String()
}

// Clients. Each protocol a caller might use: gRPC (HTTP/2 without TLS),
// Connect with JSON over HTTP/1.1, and gRPC-Web.

type protocol struct {
	name string
	opts []connect.ClientOption
	h2   bool
}

var protocols = []protocol{
	{name: "grpc", opts: []connect.ClientOption{connect.WithGRPC()}, h2: true},
	{name: "connect-json", opts: []connect.ClientOption{connect.WithProtoJSON()}},
	{name: "grpc-web", opts: []connect.ClientOption{connect.WithGRPCWeb()}},
}

// httpClient returns a client closed at cleanup: HTTP/2 without TLS (h2c)
// when h2, else HTTP/1.1. token, if set, goes in every request's
// Authorization header.
func httpClient(t *testing.T, h2 bool, token string) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	var p http.Protocols
	if h2 {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	tr.Protocols = &p
	t.Cleanup(tr.CloseIdleConnections)
	var rt http.RoundTripper = tr
	if token != "" {
		rt = bearer{token: token, next: tr}
	}
	return &http.Client{Transport: rt}
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func (e *env) stock(t *testing.T, p protocol) stockctlv1connect.StockServiceClient {
	return stockctlv1connect.NewStockServiceClient(httpClient(t, p.h2, e.token()), e.url, p.opts...)
}

func (e *env) locks(t *testing.T, p protocol) stockctlv1connect.LockServiceClient {
	return stockctlv1connect.NewLockServiceClient(httpClient(t, p.h2, e.token()), e.url, p.opts...)
}

func (e *env) token() string {
	if len(e.cfg.Tokens) > 0 {
		return e.cfg.Tokens[0]
	}
	return ""
}

// grpcStock and grpcLocks are the gRPC clients most tests use.
func (e *env) grpcStock(t *testing.T) stockctlv1connect.StockServiceClient {
	return e.stock(t, protocols[0])
}
func (e *env) grpcLocks(t *testing.T) stockctlv1connect.LockServiceClient {
	return e.locks(t, protocols[0])
}

// ctx is a test's context, bounded by hangBound.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), hangBound)
	t.Cleanup(cancel)
	return c
}

// createSKU creates a SKU through the API.
func createSKU(t *testing.T, c stockctlv1connect.StockServiceClient, req *stockctlv1.CreateSKURequest) *stockctlv1.CreateSKUResponse {
	t.Helper()
	res, err := c.CreateSKU(ctx(t), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("CreateSKU(%v): %v", req, err)
	}
	return res.Msg
}

// errorInfo returns err's connect code and the ErrorInfo's reason, and
// fails t if err is not a connect error with an ErrorInfo of our domain.
func errorInfo(t *testing.T, err error) (connect.Code, string) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a connect error", err, err)
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if info, ok := v.(*errdetails.ErrorInfo); ok {
			if info.Domain != service.ErrorDomain {
				t.Errorf("ErrorInfo domain %q, want %q", info.Domain, service.ErrorDomain)
			}
			return ce.Code(), info.Reason
		}
	}
	t.Fatalf("error %v has no ErrorInfo", err)
	return 0, ""
}

// detail returns err's first detail of type T.
func detail[T proto.Message](t *testing.T, err error) T {
	t.Helper()
	var ce *connect.Error
	var zero T
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a connect error", err)
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if m, ok := v.(T); ok {
			return m
		}
	}
	t.Fatalf("error %v has no %T detail", err, zero)
	return zero
}

// wantError checks err's code and reason.
func wantError(t *testing.T, what string, err error, code connect.Code, reason stockctlv1.ErrorReason) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %v %v", what, code, reason)
	}
	gotCode, gotReason := errorInfo(t, err)
	if gotCode != code || gotReason != reasonString(reason) {
		t.Fatalf("%s: got %v %s (%v), want %v %s", what, gotCode, gotReason, err, code, reasonString(reason))
	}
}

func reasonString(r stockctlv1.ErrorReason) string {
	s := r.String()
	const prefix = "ERROR_REASON_"
	if len(s) > len(prefix) {
		return s[len(prefix):]
	}
	return s
}

// status reads a SKU's status through the API.
func status(t *testing.T, c stockctlv1connect.StockServiceClient, sku string) *stockctlv1.StockStatus {
	t.Helper()
	res, err := c.Status(ctx(t), connect.NewRequest(&stockctlv1.StatusRequest{Sku: sku}))
	if err != nil {
		t.Fatalf("Status(%s): %v", sku, err)
	}
	return res.Msg.Status
}

// audit checks a SKU's books through the API and fails t if they do not
// balance.
func audit(t *testing.T, c stockctlv1connect.StockServiceClient, sku string) *stockctlv1.AuditResponse {
	t.Helper()
	res, err := c.Audit(ctx(t), connect.NewRequest(&stockctlv1.AuditRequest{Sku: sku}))
	if err != nil {
		t.Fatalf("Audit(%s): %v", sku, err)
	}
	if !res.Msg.Ok {
		t.Fatalf("audit of %s does not balance: %v", sku, res.Msg.Problems)
	}
	return res.Msg
}

// parallel runs f n times at once and waits.
func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

// waitFor polls cond until it holds, failing t after hangBound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %v", what, hangBound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connReady reports whether the coordinator's etcd connection is up.
func connReady(e *env) bool {
	return e.coord.Client().ActiveConnection().GetState() == connectivity.Ready
}

// healthOf asks the server's grpc.health.v1 about the whole server.
func healthOf(t *testing.T, e *env) grpchealth.Status {
	t.Helper()
	res, err := grpchealth.NewClient(httpClient(t, true, ""), e.url, connect.WithGRPC()).Check(ctx(t), &grpchealth.CheckRequest{})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return res.Status
}

// counter is the value of the series of a counter family with one label
// set to value (0 if there is none).
func counter(t *testing.T, e *env, family, label, value string) float64 {
	t.Helper()
	fams, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != family {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if m.Counter != nil {
						return m.GetCounter().GetValue()
					}
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return 0
}
