package embedetcd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/testpki"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func tlsClient(t *testing.T, eps []string, info transport.TLSInfo) (*clientv3.Client, error) {
	t.Helper()
	tc, err := info.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c, nil
}

func TestTLSWithClientCertAuth(t *testing.T) {
	pki := testpki.New(t)
	s := startT(t, Config{Dir: t.TempDir(), UnsafeNoFsync: true,
		CertFile: pki.ServerCert, KeyFile: pki.ServerKey, TrustedCAFile: pki.CA, ClientCertAuth: true})
	eps := s.Endpoints()
	if len(eps) != 1 || !strings.HasPrefix(eps[0], "https://127.0.0.1:") {
		t.Fatalf("Endpoints() = %v, want one https://127.0.0.1:<port>", eps)
	}

	c, err := tlsClient(t, eps, transport.TLSInfo{TrustedCAFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey})
	if err != nil {
		t.Fatal(err)
	}
	put(t, c, "k", "over tls")
	if got := get(t, c, "k"); got != "over tls" {
		t.Fatalf("Get = %q", got)
	}

	// Without a client certificate the member refuses the client.
	anon, err := tlsClient(t, eps, transport.TLSInfo{TrustedCAFile: pki.CA})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err = anon.Get(ctx, "k"); err == nil {
			t.Fatal("Get without a client certificate succeeded")
		}
	}
	// A plain-http client cannot talk to it either.
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{strings.Replace(eps[0], "https", "http", 1)},
		DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err == nil {
		defer plain.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := plain.Get(ctx, "k"); err == nil {
			t.Fatal("plain http Get succeeded against a TLS member")
		}
	}
}

func TestTLSConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"cert without key", Config{CertFile: "c.pem"}, "CertFile and KeyFile"},
		{"ca without cert", Config{TrustedCAFile: "ca.pem"}, "TrustedCAFile needs"},
		{"client auth without ca", Config{CertFile: "c.pem", KeyFile: "k.pem", ClientCertAuth: true}, "ClientCertAuth needs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Dir = filepath.Join(t.TempDir(), "data")
			s, err := Start(context.Background(), tc.cfg)
			if err == nil {
				s.Close()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			if _, err := os.Stat(tc.cfg.Dir); !os.IsNotExist(err) {
				t.Errorf("data dir was created: %v", err)
			}
		})
	}
}
