package service_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/testpki"
	"github.com/stockctl/stockctl/service"
)

func TestCheckListen(t *testing.T) {
	t.Parallel()
	pki := testpki.New(t)
	plainTLS, err := service.LoadTLS(pki.ServerCert, pki.ServerKey, "")
	if err != nil {
		t.Fatal(err)
	}
	mTLS, err := service.LoadTLS(pki.ServerCert, pki.ServerKey, pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	tokens := []string{testToken}
	for _, tc := range []struct {
		addr    string
		cfg     service.Config
		missing string // "" when allowed
	}{
		{"127.0.0.1:8080", service.Config{}, ""},
		{"[::1]:8080", service.Config{}, ""},
		{"localhost:8080", service.Config{}, ""},
		{"0.0.0.0:8443", service.Config{}, "TLS"},
		{":8443", service.Config{Tokens: tokens}, "TLS"},
		{"10.0.0.5:8443", service.Config{TLS: plainTLS}, "client authentication"},
		{"10.0.0.5:8443", service.Config{TLS: plainTLS, Tokens: tokens}, ""},
		{"10.0.0.5:8443", service.Config{TLS: mTLS}, ""},
		{"api.example:8443", service.Config{}, "TLS"},
	} {
		err := service.CheckListen(tc.addr, tc.cfg)
		switch {
		case tc.missing == "" && err != nil:
			t.Errorf("CheckListen(%s): %v, want allowed", tc.addr, err)
		case tc.missing != "" && (!errors.Is(err, service.ErrInsecureListen) || !strings.Contains(err.Error(), tc.missing)):
			t.Errorf("CheckListen(%s): %v, want ErrInsecureListen naming %q", tc.addr, err, tc.missing)
		}
	}
	if err := service.CheckListen("no-port", service.Config{}); err == nil {
		t.Error("CheckListen without a port: no error")
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, cfg := range []service.Config{
		{Tokens: []string{"zq7x"}},
		{Tokens: []string{"has a space in it, long enough"}},
		{MaxInflight: -1},
		{MaxBodyBytes: -1},
		{TLS: &tls.Config{}},
	} {
		if _, err := service.New(e.coord, cfg); !errors.Is(err, coordinator.ErrInvalidArgument) {
			t.Errorf("New(%+v): %v, want ErrInvalidArgument", cfg, err)
		} else if len(cfg.Tokens) > 0 && strings.Contains(err.Error(), cfg.Tokens[0]) {
			t.Errorf("the error %q shows the token", err)
		}
	}
	if _, err := service.New(nil, service.Config{}); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Errorf("New(nil): %v", err)
	}
	// Two servers cannot register the same metrics with one registry.
	if _, err := service.New(e.coord, service.Config{Registerer: e.reg}); err == nil {
		t.Error("a second server on the same registry: no error")
	}
}

func TestLoadTokens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := service.LoadTokens(write("ok", "# the shop\n"+testToken+"\n\n  other-token-0123456789  \n"))
	if err != nil || len(got) != 2 || got[1] != "other-token-0123456789" {
		t.Fatalf("LoadTokens = %q, %v", got, err)
	}
	for name, content := range map[string]string{"empty": "# nothing\n", "short": "abc\n"} {
		if _, err := service.LoadTokens(write(name, content)); err == nil {
			t.Errorf("LoadTokens(%s): no error", name)
		}
	}
}

// TLS with client certificates: a client with one is served, a client
// without one is refused at the handshake.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	pki := testpki.New(t)
	cfg, err := service.LoadTLS(pki.ServerCert, pki.ServerKey, pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, withConfig(func(c *service.Config) { c.TLS = cfg }))
	client := func(withCert bool) *http.Client {
		ca, err := os.ReadFile(pki.CA)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if withCert {
			cert, err := tls.LoadX509KeyPair(pki.ClientCert, pki.ClientKey)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	ok := stockctlv1connect.NewStockServiceClient(client(true), e.url, connect.WithGRPC())
	createSKU(t, ok, &stockctlv1.CreateSKURequest{Sku: "tls", Total: 1, Segments: 1, InitialFill: 1})
	refused := stockctlv1connect.NewStockServiceClient(client(false), e.url, connect.WithGRPC())
	if _, err := refused.Status(ctx(t), connect.NewRequest(&stockctlv1.StatusRequest{Sku: "tls"})); err == nil {
		t.Fatal("a client without a certificate was served")
	}
}

// With etcd unreachable, calls fail fast with UNAVAILABLE (503), health
// says NOT_SERVING, and all is well again once etcd is back.
func TestEtcdUnavailable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(c *service.Config) { c.EtcdWait = 200 * time.Millisecond }))
	c := e.grpcStock(t)
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "down", Total: 5, Segments: 1, InitialFill: 5})
	e.etcd.Stop()
	waitFor(t, "the etcd connection to go down", func() bool { return !connReady(e) })

	err := clients{t: t, c: c}.status("down")
	wantError(t, "Status with etcd down", err, connect.CodeUnavailable, stockctlv1.ErrorReason_ERROR_REASON_ETCD_UNAVAILABLE)
	if got := httpStatusOf(t, e, func(c clients) error { return c.allocate("down", "o-1", 1, "") }); got != http.StatusServiceUnavailable {
		t.Errorf("HTTP status with etcd down: %d, want 503", got)
	}
	if st := healthOf(t, e); st != grpchealth.StatusNotServing {
		t.Errorf("health with etcd down: %s", st)
	}

	e.etcd.Restart(t)
	waitFor(t, "the etcd connection to come back", func() bool { return connReady(e) })
	if _, err := c.Allocate(ctx(t), connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "down", Order: "o-1", Qty: 1})); err != nil {
		t.Fatalf("Allocate after etcd came back: %v", err)
	}
	audit(t, c, "down")
}
