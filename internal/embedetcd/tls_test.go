package embedetcd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files in a temp dir.
type testPKI struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	now := time.Now()
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: ips, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	srvDER, srvKey := issue(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	cliDER, cliKey := issue(3, "client", x509.ExtKeyUsageClientAuth, nil)
	return testPKI{
		CA:         write("ca.pem", "CERTIFICATE", caDER),
		ServerCert: write("server.pem", "CERTIFICATE", srvDER),
		ServerKey:  write("server-key.pem", "PRIVATE KEY", keyDER(srvKey)),
		ClientCert: write("client.pem", "CERTIFICATE", cliDER),
		ClientKey:  write("client-key.pem", "PRIVATE KEY", keyDER(cliKey)),
	}
}

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
	pki := newTestPKI(t)
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
